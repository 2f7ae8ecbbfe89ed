"""A run directory's metrics.jsonl, read into per-step and per-eval series.

The trainer writes one JSON object per line: a step line (``step``, ``loss``,
``loss/<objective>``, ``weight/<objective>``, ``lr``, ``tokens``, ``tokens_per_s``, ...)
every ``trainer.log_every`` steps and an eval line (``step``, ``eval/...``) after each
evaluation. ``tokens`` counts the non-padding tokens of that one step, and
``tokens_per_s`` the tokens since the previous step line over the seconds since it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pretextual.errors import PretextualError

METRICS_FILE = "metrics.jsonl"
TIME_KEY = "time"
"""Seconds since the run started, on each line, when the trainer writes it; without it
the wall time is rebuilt from ``tokens`` and ``tokens_per_s``."""


class RunError(PretextualError):
    """A run directory that is missing, or whose metrics.jsonl cannot be read (the message
    names the path)."""


@dataclass
class Series:
    """One metric of one run: its values at optimizer steps and at tokens seen."""

    steps: list[int]
    tokens: list[float]
    values: list[float]


@dataclass
class Run:
    """The metrics of one run directory."""

    path: Path
    steps: list[dict]
    """Step lines, in order."""
    evals: list[dict]
    """Eval lines, in order."""

    def step_keys(self) -> list[str]:
        """Keys of the step lines, in first-seen order."""
        return _keys(self.steps)

    def eval_keys(self) -> list[str]:
        """``eval/...`` keys of the eval lines, in first-seen order."""
        return [k for k in _keys(self.evals) if k.startswith("eval/")]

    def _cumulative(self) -> tuple[np.ndarray, np.ndarray]:
        """(step, tokens seen through that step), from (0, 0) through each step line.

        Exact when every step is logged (trainer.log_every=1, the default); otherwise a
        logged step's count stands for each unlogged step before it."""
        steps = np.array([0] + [line["step"] for line in self.steps], dtype=np.float64)
        per_step = np.array([line["tokens"] for line in self.steps], dtype=np.float64)
        return steps, np.concatenate([[0.0], np.cumsum(per_step * np.diff(steps))])

    def tokens_at(self, steps: list[int]) -> list[float]:
        """Tokens seen through each of ``steps`` (interpolated between logged steps)."""
        known_steps, known_tokens = self._cumulative()
        return np.interp(steps, known_steps, known_tokens).tolist()

    def series(self, key: str) -> Series:
        """The values of ``key`` from the step lines, or from the eval lines for ``eval/...``."""
        lines = [line for line in (self.evals if key.startswith("eval/") else self.steps)
                 if key in line]
        steps = [line["step"] for line in lines]
        return Series(steps, self.tokens_at(steps), [float(line[key]) for line in lines])

    @property
    def last_step(self) -> int:
        return max((line["step"] for line in self.steps + self.evals), default=0)

    @property
    def tokens_seen(self) -> float:
        return float(self._cumulative()[1][-1])

    @property
    def wall_time(self) -> float:
        """Seconds of training: the last ``time`` when lines carry one; otherwise the sum of
        each logged interval's tokens / tokens_per_s (which leaves out the set-up before the
        first step and the final evaluation and checkpoint)."""
        timed = [line[TIME_KEY] for line in self.steps + self.evals if TIME_KEY in line]
        if timed:
            return float(max(timed))
        steps, cumulative = self._cumulative()
        speeds = np.array([line["tokens_per_s"] for line in self.steps], dtype=np.float64)
        return float(np.sum(np.diff(cumulative) / np.maximum(speeds, 1e-9)))

    @property
    def tokens_per_s(self) -> float:
        """Mean throughput over the run."""
        return self.tokens_seen / self.wall_time if self.wall_time > 0 else 0.0


def _keys(lines: list[dict]) -> list[str]:
    return list(dict.fromkeys(k for line in lines for k in line))


def read_run(run_dir: str | Path) -> Run:
    """Read ``run_dir/metrics.jsonl``; a RunError naming the path when it cannot be read."""
    path = Path(run_dir)
    file = path / METRICS_FILE
    if not path.is_dir():
        raise RunError(f"{path}: no such run directory")
    if not file.is_file():
        raise RunError(f"{path}: no {METRICS_FILE} (not a run directory, or no step logged yet)")
    steps, evals = [], []
    for number, text in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
        if not text.strip():
            continue
        try:
            line = json.loads(text)
        except json.JSONDecodeError as exc:
            raise RunError(f"{file}:{number}: not valid JSON ({exc.msg})") from None
        if not isinstance(line, dict) or not isinstance(line.get("step"), int):
            raise RunError(f"{file}:{number}: expected an object with an integer 'step'")
        if any(k.startswith("eval/") for k in line):
            evals.append(line)
        elif "loss" in line:
            missing = [k for k in ("tokens", "tokens_per_s") if k not in line]
            if missing:
                raise RunError(f"{file}:{number}: step line without {', '.join(missing)}")
            steps.append(line)
    if not steps:
        raise RunError(f"{file}: holds no step line")
    return Run(path, steps, evals)
