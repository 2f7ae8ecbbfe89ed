"""The report of an ablation: report.json (every number), report.md (the command, the
budget, a table per mix with the spread over seeds, a table per run) and, when matplotlib
is installed, probes.png (one panel per probe) and curves.png (every run's curves)."""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from pretextual.analysis.compare import MISSING, format_table
from pretextual.analysis import plot
from pretextual.analysis.probes import PROBE_KEYS

if TYPE_CHECKING:
    from pretextual.analysis.ablate import Ablation, RunResult

PROBE_TITLES = {"mlm_loss": "held-out MLM loss", "mlm_accuracy": "held-out MLM accuracy",
                "pair_cls_accuracy": "pair probe, [CLS]",
                "pair_mean_accuracy": "pair probe, mean-pooled"}
REPORT, RESULTS, PROBES_PLOT, CURVES_PLOT = "report.md", "report.json", "probes.png", "curves.png"
UNTRAINED = "untrained"
"""The mix name of the baseline rows: the encoder every mix starts from, probed untrained."""


def command(ablation: Ablation, out: Path) -> str:
    """The command line that runs this ablation again."""
    words = ["pretextual", "ablate", "--mixes", ",".join(ablation.mixes), "--steps",
             str(ablation.steps), "--seeds", str(ablation.seeds), "--out", str(out),
             *(w for t in ablation.tasks for w in ("--task", t)),
             *(["--protocol", ",".join(ablation.protocols)] if ablation.tasks else []),
             *ablation.overrides]
    return " ".join(shlex.quote(w) for w in words)


def by_mix(ablation: Ablation) -> dict[str, list[RunResult]]:
    """The runs of each mix over the seeds, the untrained baseline first."""
    groups: dict[str, list[RunResult]] = {}
    for run in ablation.runs:
        groups.setdefault(run.mix, []).append(run)
    return groups


def spread(values: Sequence[float | None]) -> tuple[float, float] | None:
    """Mean and sample standard deviation (0 for one value); None when any value is missing."""
    if not values or any(v is None for v in values):
        return None
    array = np.array(values, dtype=np.float64)
    return float(array.mean()), float(array.std(ddof=1)) if len(array) > 1 else 0.0


def _cell(values: Sequence[float | None], digits: int = 3) -> str:
    stats = spread(values)
    if stats is None:
        return MISSING
    mean, std = stats
    return f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if len(values) > 1 else "")


def mix_rows(ablation: Ablation) -> list[list[str]]:
    """One row per mix: steps, tokens and wall time (means), each probe as mean ± std."""
    rows = [["mix", "seeds", "steps", "tokens", "wall time (s)",
             *(PROBE_TITLES[k] for k in PROBE_KEYS)]]
    for mix, runs in by_mix(ablation).items():
        rows.append([mix, str(len(runs)), f"{np.mean([r.steps for r in runs]):.0f}",
                     f"{np.mean([r.tokens for r in runs]):,.0f}",
                     f"{np.mean([r.wall_time for r in runs]):.1f}",
                     *(_cell([r.probes[k] for r in runs]) for k in PROBE_KEYS)])
    return rows


def run_rows(ablation: Ablation, out: Path) -> list[list[str]]:
    """One row per trained run."""
    rows = [["run", "steps", "tokens", "wall time (s)", *(PROBE_TITLES[k] for k in PROBE_KEYS)]]
    for r in ablation.runs:
        if r.run_dir:
            rows.append([f"`{Path(r.run_dir).relative_to(out)}`", str(r.steps), f"{r.tokens:,}",
                         f"{r.wall_time:.1f}", *(_cell([r.probes[k]], 4) for k in PROBE_KEYS)])
    return rows


def plot_probes(ablation: Ablation, out: Path) -> None:
    """One panel per probe: a bar per mix at the mean over seeds, the std as error bar."""
    figure, axes = plot.new_figure(2, 2, out)
    groups = by_mix(ablation)
    for ax, key in zip(axes.flat, PROBE_KEYS):
        stats = {mix: spread([r.probes[key] for r in runs]) for mix, runs in groups.items()}
        shown = [mix for mix, s in stats.items() if s is not None]
        ax.bar(range(len(shown)), [stats[m][0] for m in shown],
               yerr=[stats[m][1] for m in shown], capsize=4, color="tab:blue")
        ax.set_xticks(range(len(shown)), shown, rotation=20)
        if key.startswith("pair"):
            ax.axhline(0.5, color="grey", linestyle="--", linewidth=1)  # chance: balanced labels
        ax.set_title(PROBE_TITLES[key], fontsize=10)
    plot.save(figure, out)


def write_report(ablation: Ablation, out: str | Path) -> Path:
    """Write report.json, report.md and the plots into ``out``; returns report.md."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / RESULTS).write_text(json.dumps(asdict(ablation), indent=2) + "\n")
    trained = [r for r in ablation.runs if r.run_dir]
    per_step = ", ".join(f"{m} {t:,.0f}" for m, t in ablation.tokens_per_step.items())
    lines = [f"# Ablation: {', '.join(ablation.mixes)}", "",
             "```bash", command(ablation, out), "```", "",
             f"- Budget: {ablation.budget:,} tokens per run, {ablation.steps} steps of the "
             f"sparsest mix (measured tokens per step: {per_step}).",
             f"- Seeds: {', '.join(str(s) for s in range(ablation.seeds))}; the `{UNTRAINED}` "
             f"row probes the shared initial encoder of each seed.",
             f"- Probes on {ablation.probe_data}. MLM: the `mlm` head on the same 15% masking "
             f"(80/10/10) for every mix (n/a: the mix has no `mlm` head). Pair probe: accuracy of "
             f"a linear probe on frozen segment embeddings telling same-document from "
             f"different-document segments (chance 0.5), cross-validated by document.", "",
             format_table(mix_rows(ablation), markdown=True), "",
             "Mean ± sample standard deviation over seeds.", ""]
    if plot.matplotlib_installed():
        plot_probes(ablation, out / PROBES_PLOT)
        plot.plot_runs([r.run_dir for r in trained], out / CURVES_PLOT,
                       labels=[f"{r.mix}/seed{r.seed}" for r in trained])
        lines += [f"![probes]({PROBES_PLOT})", "", f"![training curves]({CURVES_PLOT})", ""]
    else:
        lines += ["(No plots: they need matplotlib, `pip install 'pretextual[plot]'`.)", ""]
    if ablation.downstream is not None:
        from pretextual.evaluation.report import format_tables
        lines += ["## Downstream", "",
                  f"Each trained run scored by `pretextual evaluate` ({', '.join(ablation.protocols)}) "
                  f"on {', '.join(ablation.tasks)}, the same splits for every run:", "",
                  "```", format_tables(ablation.downstream).rstrip(), "```", "",
                  "Each pair of mixes (mean over pretraining seeds of the difference between "
                  "their runs of one seed; beyond the noise past 2 standard errors):", ""]
        lines += [f"- {d['task']} ({d['protocol']}): {d['a']} - {d['b']} = "
                  f"{d['difference']:+.4f} (se {d['se']:.4f}): {d['verdict']}"
                  for d in ablation.mix_differences] + [""]
    lines += ["## Runs", "", format_table(run_rows(ablation, out), markdown=True), ""]
    report = out / REPORT
    report.write_text("\n".join(lines))
    return report
