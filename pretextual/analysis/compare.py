"""Runs side by side: steps, tokens seen, wall time and tokens/s, each training loss term at
the start and at the end of training, then each eval metric's final value and best value
(with its step), one column per run."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from pretextual.analysis.metrics import Run, read_run
from pretextual.analysis.plot import short_labels

MISSING = "n/a"
TRAIN_WINDOW = 0.1
"""Share of the logged steps averaged for a training loss at the start and at the end: one
step's loss is too noisy to say whether a term fell."""


def lower_is_better(metric: str) -> bool:
    """Losses and perplexities fall as a model improves; accuracies and the like rise."""
    return "loss" in metric or "perplexity" in metric


@dataclass
class Summary:
    """What the comparison shows of one run."""

    label: str
    steps: int
    tokens: float
    wall_time: float
    tokens_per_s: float
    train: dict[str, tuple[float, float]]
    """Each training loss (``loss``, ``loss/<objective>``): its mean over the first and over
    the last tenth of the logged steps."""
    final: dict[str, float]
    """Each eval metric at the last evaluation."""
    best: dict[str, tuple[float, int]]
    """Each eval metric's best value over the evaluations, and its step."""


def start_and_end(values: list[float]) -> tuple[float, float]:
    """Mean of the first and of the last tenth of ``values`` (at least one value each)."""
    n = max(1, math.ceil(len(values) * TRAIN_WINDOW))
    return float(np.mean(values[:n])), float(np.mean(values[-n:]))


def summarize(run: Run, label: str) -> Summary:
    """The summary of one run."""
    train = {}
    for key in run.step_keys():
        if key == "loss" or key.startswith("loss/"):
            values = [v for v in run.series(key).values if math.isfinite(v)]
            if values:
                train[key] = start_and_end(values)
    final = {k: float(v) for k, v in run.evals[-1].items() if k.startswith("eval/")} \
        if run.evals else {}
    best = {}
    for metric in run.eval_keys():
        series = run.series(metric)
        points = [(v, s) for s, v in zip(series.steps, series.values) if math.isfinite(v)]
        if points:
            pick = min if lower_is_better(metric) else max
            value = pick(v for v, _ in points)
            best[metric] = (value, next(s for v, s in points if v == value))
    return Summary(label, run.last_step, run.tokens_seen, run.wall_time, run.tokens_per_s,
                   train, final, best)


def compare(run_dirs: Sequence[str | Path], labels: Sequence[str] | None = None) -> list[Summary]:
    """Read and summarize each run (labelled by the shortest distinct path suffix)."""
    runs = [read_run(d) for d in run_dirs]
    labels = list(labels) if labels is not None else short_labels([r.path for r in runs])
    return [summarize(run, label) for run, label in zip(runs, labels)]


def comparison_rows(summaries: Sequence[Summary]) -> list[list[str]]:
    """The table, header first: one row per quantity, one column per run."""
    rows = [["", *(s.label for s in summaries)],
            ["steps", *(str(s.steps) for s in summaries)],
            ["tokens seen", *(f"{s.tokens:,.0f}" for s in summaries)],
            ["wall time (s)", *(f"{s.wall_time:.1f}" for s in summaries)],
            ["tokens/s", *(f"{s.tokens_per_s:,.0f}" for s in summaries)]]
    for key in dict.fromkeys(k for s in summaries for k in s.train):
        rows.append([f"{key} start -> end", *(f"{s.train[key][0]:.4f} -> {s.train[key][1]:.4f}"
                                              if key in s.train else MISSING for s in summaries)])
    metrics = dict.fromkeys(k for s in summaries for k in list(s.final) + list(s.best))
    for metric in metrics:
        rows.append([f"{metric} final", *(f"{s.final[metric]:.4f}" if metric in s.final
                                          else MISSING for s in summaries)])
        rows.append([f"{metric} best", *(f"{s.best[metric][0]:.4f} @{s.best[metric][1]}"
                                         if metric in s.best else MISSING for s in summaries)])
    return rows


def format_table(rows: Sequence[Sequence[str]], markdown: bool = False) -> str:
    """Rows (header first) as aligned text, or as a markdown table; the first column is
    left-aligned, the others right-aligned."""
    if markdown:
        lines = ["| " + " | ".join(rows[0]) + " |",
                 "| --- |" + " ---: |" * (len(rows[0]) - 1)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows[1:]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths))).rstrip()
                     for r in rows)
