"""Training curves and evaluations of one or more runs, in a grid of titled sections:
losses, per-objective training metrics, evaluation, learning rate (with the objective
weights that are scheduled). Runs are overlaid, one colour per run and one legend.

The x axis is the optimizer step, with tokens seen on a secondary axis on top; when the
runs see tokens at different rates (an ablation at a fixed token budget) it is tokens seen.
Training curves are smoothed by a debiased exponential moving average, the raw values
drawn faintly behind; evaluations are few points and drawn as they are, with markers.

Needs matplotlib (``pip install 'pretextual[plot]'``); it is imported only when drawing,
and only its object-oriented API is used (no pyplot), so no display or backend is needed.
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from pretextual.analysis.metrics import Run, read_run
from pretextual.core.run_dir import RUN_PLOT
from pretextual.errors import PretextualError
from pretextual.plugins.hookspecs import hookimpl

PANEL_WIDTH, PANEL_HEIGHT, DPI = 4.5, 3.0, 100
"""Inches per panel of new_figure and dots per inch: each panel is 450 x 300 pixels."""

GROUPS = ("losses", "training metrics", "evaluation", "learning rate")
"""The sections of a run plot, top to bottom; each starts a row of the grid."""
SMOOTHED_GROUPS = ("losses", "training metrics")
"""Noisy per-step curves; the learning rate and weights are schedules, drawn as they are."""
COLUMNS = 5
"""Panels per row at most: five 370-pixel panels fill a 1920-pixel-wide screen."""
GRID_PANEL_WIDTH, GRID_PANEL_HEIGHT, SECTION_TITLE_HEIGHT, HEADER_HEIGHT = 3.7, 2.3, 0.3, 0.6
"""Inches: a grid panel is 370 x 230 pixels; each section adds its title, the figure a
legend and a note. Five rows in four sections are 1330 pixels high (a bert run takes four
rows, 1100 pixels); more rows grow the height, never the columns."""
SAME_TOKEN_RATE = 0.05
"""Runs whose tokens per step agree within this fraction share the step axis."""
ROUND_STEPS = [1, 2, 2.5, 5, 10]
"""Tick spacings on count axes: 10, 20, 25, 50 rather than matplotlib's 15 or 30."""


class PlotError(PretextualError):
    """A plot that cannot be drawn (matplotlib missing, an unknown image format, a file
    that cannot be written)."""


@dataclass
class Panel:
    """One panel: a metric of a section (one of GROUPS) against ``x`` ("step" or
    "tokens"), one line per run label."""

    group: str
    metric: str
    x: str
    lines: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)


def grouped_metrics(runs: Sequence[Run]) -> dict[str, list[str]]:
    """The metrics of each non-empty section, in the order of GROUPS.

    losses: ``loss`` then each ``loss/<objective>``; training metrics: the step lines'
    ``<objective>/<metric>`` keys; evaluation: ``eval/loss``, ``eval/loss/<objective>``,
    ``eval/<objective>/...``, then the rest (downstream probes); learning rate: ``lr`` and
    each ``weight/<objective>`` that changes during a run."""
    steps = list(dict.fromkeys(k for run in runs for k in run.step_keys()))
    evals = list(dict.fromkeys(k for run in runs for k in run.eval_keys()))
    losses = [k for k in steps if k == "loss" or k.startswith("loss/")]
    objectives = [k.removeprefix("loss/") for k in losses if k != "loss"]

    def eval_rank(key: str) -> tuple[int, int]:
        """Losses, then objectives' metrics, each in the objectives' order; then the rest."""
        name = key.removeprefix("eval/")
        if name == "loss":
            return 0, -1
        if name.startswith("loss/"):
            objective = name.removeprefix("loss/")
            return 0, objectives.index(objective) if objective in objectives else len(objectives)
        objective = name.split("/")[0]
        return (1, objectives.index(objective)) if objective in objectives else (2, 0)

    groups = {
        "losses": losses,
        "training metrics": [k for k in steps if "/" in k and k not in losses
                             and not k.startswith("weight/")],
        "evaluation": sorted(evals, key=eval_rank),  # stable: first-seen order within a rank
        "learning rate": [k for k in steps if k == "lr"] + [
            k for k in steps if k.startswith("weight/")
            and any(len(set(run.series(k).values)) > 1 for run in runs)],
    }
    return {group: keys for group, keys in groups.items() if keys}


def x_axis(runs: Sequence[Run]) -> str:
    """"step" when the runs see about as many tokens per step (then tokens seen go on a
    secondary axis), else "tokens": steps of runs at different rates are not comparable."""
    rates = [run.tokens_seen / max(run.steps[-1]["step"], 1) for run in runs]
    return "step" if max(rates) <= min(rates) * (1 + SAME_TOKEN_RATE) else "tokens"


def build_panels(runs: Sequence[Run], labels: Sequence[str]) -> list[Panel]:
    """The panels of a plot, section by section, holding each run's raw values."""
    x = x_axis(runs)
    panels = []
    for group, metrics in grouped_metrics(runs).items():
        for metric in metrics:
            panel = Panel(group, metric, x)
            for run, label in zip(runs, labels):
                series = run.series(metric)
                if series.values:
                    panel.lines[label] = (list(series.steps if x == "step" else series.tokens),
                                          series.values)
            panels.append(panel)
    return panels


def describe(panels: Sequence[Panel]) -> str:
    """What a plot shows, in words: its panels per section and its x axis."""
    counts = ", ".join(f"{group} {len(p)}" for group, p in sections(panels)[1].items())
    x = "steps (tokens seen on top)" if panels and panels[0].x == "step" else "tokens seen"
    return f"{len(panels)} panels ({counts}) against {x}"


def smoothing_weight(points: int) -> float:
    """The moving average's weight for a curve of ``points`` points: a window of about a
    twentieth of the curve, so a long run reads as smooth as a short one at the same width;
    at least TensorBoard's default 0.6, at most 0.99."""
    return min(0.99, max(0.6, 1 - 20 / max(points, 1)))


def smooth(values: Sequence[float], weight: float) -> list[float]:
    """The exponential moving average of ``values``, debiased as TensorBoard does: the
    average started at 0 is divided by 1 - weight**n, so the first value is kept as it is
    rather than pulled towards 0. A non-finite value is passed through and left out."""
    smoothed, average, count = [], 0.0, 0
    for value in values:
        if not math.isfinite(value):
            smoothed.append(value)
            continue
        average = weight * average + (1 - weight) * value
        count += 1
        smoothed.append(average / (1 - weight ** count))
    return smoothed


def format_count(value: float, _position=None) -> str:
    """A step or token count in a few characters: 0, 500, 1k, 10k, 1.5M, 2B (a matplotlib
    tick formatter)."""
    value = float(f"{value:.3g}")  # rounded first, so that 999.9 reads 1k, not 1e+03
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:g}{suffix}"
    return f"{value:g}" if value else "0"


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


def blank_figure(width: float, height: float, out: Path):
    """An empty constrained-layout figure of width x height inches; a PlotError when
    matplotlib cannot write ``out``'s format."""
    require_matplotlib(f"writing {out}")
    from matplotlib.figure import Figure
    figure = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    formats = figure.canvas.get_supported_filetypes()
    if out.suffix.lstrip(".").lower() not in formats:
        raise PlotError(f"{out}: unknown image format (known: {', '.join(sorted(formats))})")
    return figure


def new_figure(rows: int, columns: int, out: Path):
    """A figure of rows x columns panels of PANEL_WIDTH x PANEL_HEIGHT inches, and its axes;
    a PlotError when matplotlib cannot write ``out``'s format."""
    figure = blank_figure(columns * PANEL_WIDTH, rows * PANEL_HEIGHT, out)
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


def sections(panels: Sequence[Panel]) -> tuple[int, dict[str, list[Panel]]]:
    """The grid's columns (the largest section, at most COLUMNS) and the panels of each
    section in order."""
    by_group: dict[str, list[Panel]] = {}
    for panel in panels:
        by_group.setdefault(panel.group, []).append(panel)
    return min(COLUMNS, max((len(p) for p in by_group.values()), default=1)), by_group


def steps_to_tokens(run: Run) -> tuple[Callable, Callable]:
    """The run's step -> tokens seen relation and its inverse, for a secondary axis."""
    steps = [0] + [line["step"] for line in run.steps]
    tokens = run.tokens_at(steps)
    # Past both ends at the mean rate, so the axis margins get ticks too (interp clamps).
    span = steps[-1]
    steps = [-span, *steps, 2 * span]
    tokens = [-tokens[-1], *tokens, 2 * tokens[-1]]
    return (lambda s: np.interp(s, steps, tokens)), (lambda t: np.interp(t, tokens, steps))


def run_figure(panels: Sequence[Panel], labels: Sequence[str], out: Path,
               tokens_axis: tuple[Callable, Callable] | None = None):
    """The figure of the panels: a titled section per group of COLUMNS-wide rows, each
    run in one colour everywhere, one legend; ``tokens_axis`` (step -> tokens and back)
    puts tokens seen on top of step axes."""
    columns, by_group = sections(panels)
    rows = {group: math.ceil(len(p) / columns) for group, p in by_group.items()}
    height = (sum(rows.values()) * GRID_PANEL_HEIGHT + len(rows) * SECTION_TITLE_HEIGHT
              + HEADER_HEIGHT)
    figure = blank_figure(columns * GRID_PANEL_WIDTH, height, out)
    import matplotlib
    from matplotlib.ticker import FuncFormatter, MaxNLocator
    cycle = [c["color"] for c in matplotlib.rcParams["axes.prop_cycle"]]
    colours = {label: cycle[i % len(cycle)] for i, label in enumerate(labels)}
    handles = {}
    subfigures = figure.subfigures(len(rows), 1, squeeze=False,
                                   height_ratios=[rows[g] * GRID_PANEL_HEIGHT + SECTION_TITLE_HEIGHT
                                                  for g in rows])
    for subfigure, (group, group_panels) in zip(subfigures.flat, by_group.items()):
        subfigure.suptitle(group, x=0.005, ha="left", fontsize=11, fontweight="bold")
        axes = subfigure.subplots(rows[group], columns, squeeze=False)
        for ax in axes.flat[len(group_panels):]:
            ax.set_visible(False)
        for ax, panel in zip(axes.flat, group_panels):
            for label, (xs, ys) in panel.lines.items():
                if group == "evaluation":  # few points, often one: markers keep them visible
                    line, = ax.plot(xs, ys, color=colours[label], linewidth=1, marker="o",
                                    markersize=3)
                elif group in SMOOTHED_GROUPS:
                    ax.plot(xs, ys, color=colours[label], linewidth=0.8, alpha=0.25)
                    line, = ax.plot(xs, smooth(ys, smoothing_weight(len(ys))),
                                    color=colours[label], linewidth=1.5)
                else:
                    line, = ax.plot(xs, ys, color=colours[label], linewidth=1.5)
                handles.setdefault(label, line)
            ax.set_title(panel.metric, fontsize=9)
            ax.tick_params(labelsize=8)
            ax.xaxis.set_major_locator(MaxNLocator(5, steps=ROUND_STEPS, integer=True))
            ax.xaxis.set_major_formatter(FuncFormatter(format_count))
            ax.ticklabel_format(axis="y", style="plain", useOffset=False)
            ax.grid(alpha=0.3)
            if panel.x == "step" and tokens_axis is not None:
                top = ax.secondary_xaxis("top", functions=tokens_axis)
                top.xaxis.set_major_locator(MaxNLocator(4, steps=ROUND_STEPS))
                top.xaxis.set_major_formatter(FuncFormatter(format_count))
                top.tick_params(labelsize=7, colors="dimgrey")
    if tokens_axis is not None:
        x = "step (tokens seen on top)"
    else:
        x = "tokens seen" if panels and panels[0].x == "tokens" else "step"
    figure.supxlabel(f"x: {x}. Training curves: moving average, raw values faint behind; "
                     f"evaluations: as measured.", fontsize=9, color="dimgrey")
    shown = [label for label in labels if label in handles]
    figure.legend([handles[label] for label in shown], shown, loc="outside upper center",
                  ncols=min(len(shown), COLUMNS), fontsize=9, frameon=False)
    return figure


def plot_runs(run_dirs: Sequence[str | Path], out: str | Path,
              labels: Sequence[str] | None = None) -> list[Panel]:
    """Plot the runs into the image ``out`` (its format from the suffix, e.g. .png);
    returns the panels drawn, with the raw data of each line."""
    out = Path(out)
    runs = [read_run(d) for d in run_dirs]
    labels = list(labels) if labels is not None else short_labels([r.path for r in runs])
    panels = build_panels(runs, labels)
    tokens_axis = steps_to_tokens(runs[0]) if x_axis(runs) == "step" else None
    save(run_figure(panels, labels, out, tokens_axis), out)
    return panels


@hookimpl
def pretextual_on_train_start(trainer):
    if trainer.cfg.trainer.plot and not matplotlib_installed():
        trainer.log("note: trainer.plot is on, but matplotlib is not installed, so this run "
                    "draws no metrics.png: pip install 'pretextual[plot]' (or set "
                    "trainer.plot=false)")


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
