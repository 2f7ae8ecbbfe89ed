"""Loss curves and eval metrics of one or more runs: one panel per metric, against steps
(left column) and tokens seen (right column), runs overlaid with one legend.

Needs matplotlib (``pip install 'pretextual[plot]'``); it is imported only when drawing,
and only its object-oriented API is used (no pyplot), so no display or backend is needed.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from pretextual.analysis.metrics import Run, read_run
from pretextual.core.run_dir import RUN_PLOT
from pretextual.errors import PretextualError
from pretextual.plugins.hookspecs import hookimpl

PANEL_WIDTH, PANEL_HEIGHT, DPI = 4.5, 3.0, 100
"""Inches per panel and dots per inch: each panel is 450 x 300 pixels."""
X_AXES = ("step", "tokens")


class PlotError(PretextualError):
    """A plot that cannot be drawn (matplotlib missing, an unknown image format, a file
    that cannot be written)."""


@dataclass
class Panel:
    """One panel: a metric against ``x`` ("step" or "tokens"), one line per run label."""

    metric: str
    x: str
    lines: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)


def plotted_metrics(runs: Sequence[Run]) -> list[str]:
    """What gets a panel: the total loss and each loss term of the step lines, then every
    eval metric, each in the order first seen over the runs."""
    losses = [k for run in runs for k in run.step_keys() if k == "loss" or k.startswith("loss/")]
    evals = [k for run in runs for k in run.eval_keys()]
    return list(dict.fromkeys(losses + evals))


def build_panels(runs: Sequence[Run], labels: Sequence[str]) -> list[Panel]:
    """The panels of a plot, row by row (a metric against steps, then against tokens)."""
    panels = []
    for metric in plotted_metrics(runs):
        for x in X_AXES:
            panel = Panel(metric, x)
            for run, label in zip(runs, labels):
                series = run.series(metric)
                if series.values:
                    xs = series.steps if x == "step" else series.tokens
                    panel.lines[label] = (list(xs), series.values)
            panels.append(panel)
    return panels


def short_labels(paths: Sequence[Path]) -> list[str]:
    """The fewest trailing path components that tell the runs apart."""
    parts = [Path(p).resolve().parts for p in paths]
    for n in range(1, max(len(p) for p in parts) + 1):
        labels = ["/".join(p[-n:]) for p in parts]
        if len(set(labels)) == len(labels):
            return labels
    return [str(p) for p in paths]  # the same directory given twice


def matplotlib_installed() -> bool:
    """Whether matplotlib can be imported (without importing it)."""
    return importlib.util.find_spec("matplotlib") is not None


def require_matplotlib(what: str) -> None:
    """A PlotError saying how to install matplotlib, when it is missing."""
    if not matplotlib_installed():
        raise PlotError(f"{what} needs matplotlib: pip install 'pretextual[plot]'")


def new_figure(rows: int, columns: int, out: Path):
    """A figure of rows x columns panels of PANEL_WIDTH x PANEL_HEIGHT inches, and its axes;
    a PlotError when matplotlib cannot write ``out``'s format."""
    require_matplotlib(f"writing {out}")
    from matplotlib.figure import Figure
    figure = Figure(figsize=(columns * PANEL_WIDTH, rows * PANEL_HEIGHT), dpi=DPI,
                    layout="constrained")
    formats = figure.canvas.get_supported_filetypes()
    if out.suffix.lstrip(".").lower() not in formats:
        raise PlotError(f"{out}: unknown image format (known: {', '.join(sorted(formats))})")
    return figure, figure.subplots(rows, columns, squeeze=False)


def save(figure, out: Path) -> None:
    """Write the figure, making ``out``'s directory if needed; a PlotError names ``out``
    when it cannot be written (a file in its path, no permission, a read-only place)."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(out, dpi=DPI)
    except OSError as exc:
        # mkdir fails on a part of the path (a file where a folder must be): name that part
        where = "" if exc.filename in (None, str(out)) else f"{exc.filename}: "
        reason = "exists and is not a directory" if isinstance(exc, FileExistsError) else exc.strerror
        raise PlotError(f"{out}: cannot write the image ({where}{reason})") from None


def draw(panels: Sequence[Panel], labels: Sequence[str], out: Path) -> None:
    """Draw the panels two to a row into ``out``, each run in one colour everywhere."""
    figure, axes = new_figure(len(panels) // len(X_AXES), len(X_AXES), out)
    import matplotlib
    cycle = [c["color"] for c in matplotlib.rcParams["axes.prop_cycle"]]
    colours = {label: cycle[i % len(cycle)] for i, label in enumerate(labels)}
    handles = {}
    for ax, panel in zip(axes.flat, panels):
        is_eval = panel.metric.startswith("eval/")
        for label, (xs, ys) in panel.lines.items():
            # Evals are few points, often one: markers keep them visible.
            (line,) = ax.plot(xs, ys, color=colours[label], linewidth=1,
                              marker="o" if is_eval else None, markersize=3)
            handles.setdefault(label, line)
        ax.set_title(panel.metric, fontsize=10)
        ax.set_xlabel("tokens seen" if panel.x == "tokens" else "step")
        ax.grid(alpha=0.3)
    figure.legend([handles[l] for l in labels if l in handles], [l for l in labels if l in handles],
                  loc="outside upper center", ncols=min(len(handles), 4), fontsize=9)
    save(figure, out)


def plot_runs(run_dirs: Sequence[str | Path], out: str | Path,
              labels: Sequence[str] | None = None) -> list[Panel]:
    """Plot the runs into the image ``out`` (its format from the suffix, e.g. .png);
    returns the panels drawn, with the data of each line."""
    out = Path(out)
    runs = [read_run(d) for d in run_dirs]
    labels = list(labels) if labels is not None else short_labels([r.path for r in runs])
    panels = build_panels(runs, labels)
    draw(panels, labels, out)
    return panels


@hookimpl
def pretextual_on_train_end(metrics, trainer):
    """The built-in plot: ``metrics.png`` in the run directory when trainer.plot is set."""
    if trainer.cfg.trainer.plot:
        plot_run_if_possible(trainer.out, log=trainer.log)


def plot_run_if_possible(run_dir: str | Path, log: Callable[[str], None] = print) -> Path | None:
    """At the end of training: plot the run into ``run_dir/metrics.png`` when matplotlib is
    installed; returns the file, or None when there is no plot."""
    if not matplotlib_installed():
        return None
    out = Path(run_dir) / RUN_PLOT
    try:
        plot_runs([run_dir], out)
    except Exception as exc:  # a finished run must not fail over its optional picture
        log(f"warning: no plot of the run: {type(exc).__name__}: {exc}")
        return None
    log(f"plot: {out}")
    return out
