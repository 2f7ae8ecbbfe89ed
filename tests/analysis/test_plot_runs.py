"""pretextual plot: a grid of titled sections (losses, training metrics, evaluation,
learning rate) that fits a screen, smoothed training curves over their raw values, short
count ticks and one legend, holding exactly the numbers of metrics.jsonl."""

import math
from itertools import accumulate
from pathlib import Path

import pytest
import torch

from analysis_helpers import png_size, read_lines, write_metrics
from pretextual.analysis import plot
from pretextual.analysis.metrics import read_run
from pretextual.analysis.plot import (GROUPS, PlotError, format_count, grouped_metrics,
                                      plot_run_if_possible, plot_runs, run_figure, smooth,
                                      smoothing_weight, steps_to_tokens)
from pretextual.cli import main
from pretextual.core.config import load_config
from pretextual.core.trainer import Trainer
from run_helpers import tiny_overrides

# The bert run of two_runs: its panels, section by section.
BERT = {"losses": ["loss", "loss/mlm", "loss/nsp"],
        "training metrics": ["mlm/accuracy", "nsp/accuracy"],
        "evaluation": ["eval/loss", "eval/loss/mlm", "eval/loss/nsp", "eval/mlm/accuracy",
                       "eval/nsp/accuracy"],
        "learning rate": ["lr"]}
SCREEN = (1900, 1400)  # pixels a plot may take: a 1920 x 1080 screen at 100 DPI, scrolled


@pytest.fixture
def matplotlib():
    return pytest.importorskip("matplotlib")


@pytest.fixture(scope="module")
def albert_run(corpus_file, cache_dir, tmp_path_factory) -> Path:
    """An albert run (wwm and sop) whose sop weight ramps up, evaluated at its end."""
    out = tmp_path_factory.mktemp("albert") / "run"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    overrides = tiny_overrides(corpus_file, cache_dir, out, steps=4) + [
        "objectives.sop.start_weight=0", "objectives.sop.schedule=linear",
        "objectives.sop.schedule_steps=2"]
    Trainer(load_config("albert", overrides), log=lambda *_: None).train()
    torch.set_num_threads(threads)
    return out


def step_line(step: int, objectives: list[str], tokens: int = 100, **extra) -> dict:
    """A step line as the trainer writes it, with a loss and an accuracy per objective."""
    line = {"step": step, "loss": 10.0 / step}
    line.update({f"loss/{o}": 5.0 / step for o in objectives})
    line.update({f"{o}/accuracy": 0.1 * step for o in objectives})
    line.update({f"weight/{o}": 1.0 for o in objectives})
    return {**line, "lr": 1e-3 * step, "tokens": tokens, "tokens_per_s": 50.0, **extra}


def eval_line(step: int, objectives: list[str], **extra) -> dict:
    return {"step": step, "eval/loss": 9.0 / step, **{f"eval/loss/{o}": 4.0 / step for o in objectives},
            **{f"eval/{o}/accuracy": 0.2 * step for o in objectives}, **extra}


def expected_lines(run_dir, metric: str, x: str) -> tuple[list, list]:
    """A metric's points read straight from metrics.jsonl: x is the step or the tokens seen."""
    lines = read_lines(run_dir)
    steps = [l for l in lines if "loss" in l]
    seen = dict(zip([l["step"] for l in steps], accumulate(l["tokens"] for l in steps)))
    points = [l for l in lines if metric in l]
    return ([l["step"] if x == "step" else seen[l["step"]] for l in points],
            [l[metric] for l in points])


def sections_of(panels) -> dict[str, list[str]]:
    grouped = {}
    for panel in panels:
        grouped.setdefault(panel.group, []).append(panel.metric)
    return grouped


def shown_ticks(ax) -> list[str]:
    """The x tick labels inside the axes' limits (matplotlib also keeps one past each end)."""
    low, high = sorted(ax.get_xlim())
    return [t.get_text() for t in ax.get_xticklabels() if low <= t.get_position()[0] <= high]


def test_two_runs_overlaid_hold_the_numbers_of_their_metrics(matplotlib, two_runs, tmp_path):
    out = tmp_path / "plots" / "runs.png"
    panels = plot_runs(two_runs, out)
    # roberta (a) logs mlm only; bert (b) adds nsp. Their tokens per step are within 5%
    # (about 232 and 240), so both are drawn against steps.
    assert sections_of(panels) == BERT
    assert {p.x for p in panels} == {"step"}
    for panel in panels:
        expected = {label: expected_lines(run, panel.metric, panel.x)
                    for label, run in zip("ab", two_runs)}
        assert panel.lines == {k: v for k, v in expected.items() if v[1]}, panel
    assert [set(p.lines) for p in panels if p.metric in ("loss/nsp", "nsp/accuracy")] == [{"b"}] * 2
    assert [len(p.lines["a"][0]) for p in panels if p.metric == "eval/loss"] == [2]
    assert png_size(out) == (5 * 370, 4 * 230 + 4 * 30 + 60)


def test_a_bert_run_fits_a_screen_in_eleven_panels(matplotlib, two_runs, tmp_path):
    panels = plot_runs([two_runs[1]], tmp_path / "bert.png")
    assert sections_of(panels) == BERT
    assert len(panels) == 11 and list(sections_of(panels)) == list(GROUPS)
    assert {p.x for p in panels} == {"step"}
    width, height = png_size(tmp_path / "bert.png")
    assert (width, height) == (1850, 1100)  # 5 columns, 4 rows: one per section
    assert width <= SCREEN[0] and height <= SCREEN[1]


def test_a_scheduled_weight_joins_the_learning_rate(matplotlib, albert_run, tmp_path):
    panels = plot_runs([albert_run], tmp_path / "albert.png")
    sections = sections_of(panels)
    assert sections["learning rate"] == ["lr", "weight/sop"]  # weight/wwm stays at 1
    assert sections["losses"] == ["loss", "loss/sop", "loss/wwm"]
    assert sections["evaluation"] == ["eval/loss", "eval/loss/sop", "eval/loss/wwm",
                                      "eval/sop/accuracy", "eval/wwm/accuracy"]
    assert len(panels) == 12
    assert png_size(tmp_path / "albert.png") == (1850, 1100)


def test_more_panels_than_fit_grow_the_height_not_the_columns(matplotlib, tmp_path):
    # Six objectives (plugins can add them): losses 7 and metrics 6 take two rows each,
    # evaluation 13 takes three, the learning rate one: 8 rows of 5 columns.
    objectives = [f"o{i}" for i in range(6)]
    run = write_metrics(tmp_path / "six", [step_line(s, objectives) for s in (1, 2, 3)]
                        + [eval_line(3, objectives)])
    panels = plot_runs([run], tmp_path / "six.png")
    assert [len(m) for m in sections_of(panels).values()] == [7, 6, 13, 1]
    assert png_size(tmp_path / "six.png") == (1850, 8 * 230 + 4 * 30 + 60)


def test_sections_keep_their_order_and_probes_come_last(tmp_path):
    run = write_metrics(tmp_path / "run", [
        {"step": 0, "eval/topics/accuracy": 0.25},  # the untrained encoder's probe
        {**step_line(1, ["mlm", "nsp"]), "weight/nsp": 0.0, "skipped": 1},
        {**step_line(2, ["mlm", "nsp"]), "weight/nsp": 0.5},
        eval_line(2, ["nsp", "mlm"], **{"eval/topics/accuracy": 0.5})])
    assert grouped_metrics([read_run(run)]) == {
        "losses": ["loss", "loss/mlm", "loss/nsp"],
        "training metrics": ["mlm/accuracy", "nsp/accuracy"],
        "evaluation": ["eval/loss", "eval/loss/mlm", "eval/loss/nsp", "eval/mlm/accuracy",
                       "eval/nsp/accuracy", "eval/topics/accuracy"],
        "learning rate": ["lr", "weight/nsp"]}


def test_the_moving_average_is_debiased():
    assert smooth([1.0, 2.0, 3.0], 0.5) == pytest.approx([1.0, 1.25 / 0.75, 2.125 / 0.875])
    assert smooth([4.0, 4.0, 4.0], 0.9) == pytest.approx([4.0, 4.0, 4.0])  # no pull to 0
    smoothed = smooth([1.0, math.nan, 3.0], 0.5)
    assert smoothed[0] == 1.0 and math.isnan(smoothed[1]) and smoothed[2] == pytest.approx(1.75 / 0.75)
    assert [smoothing_weight(n) for n in (1, 60, 200, 1000, 10**6)] == pytest.approx(
        [0.6, 2 / 3, 0.9, 0.98, 0.99])


def test_counts_read_1k_1M_1B():
    values = [0, 2.5, 500, 999.9, 1000, 1500, 10_000, 250_000, 1e6, 1.25e6, 1.5e9, 2e12, -20]
    assert [format_count(v) for v in values] == [
        "0", "2.5", "500", "1k", "1k", "1.5k", "10k", "250k", "1M", "1.25M", "1.5B", "2T", "-20"]


def test_two_runs_get_one_legend_and_a_tokens_axis_on_top(matplotlib, tmp_path):
    # The same tokens per step: steps are comparable, tokens seen go on top.
    runs = [read_run(write_metrics(tmp_path / name, [step_line(s, ["mlm"], tokens=1000)
                                                       for s in range(1, 41)]))
            for name in ("a", "b")]
    out = tmp_path / "two.png"
    figure = run_figure(plot.build_panels(runs, ["a", "b"]), ["a", "b"], out,
                        steps_to_tokens(runs[0]))
    plot.save(figure, out)
    assert len(figure.legends) == 1
    assert [t.get_text() for t in figure.legends[0].get_texts()] == ["a", "b"]
    axes = [ax for subfigure in figure.subfigs for ax in subfigure.axes if ax.get_visible()]
    assert all(ax.get_legend() is None for ax in axes)
    assert [ax.get_title() for ax in axes] == ["loss", "loss/mlm", "mlm/accuracy", "lr"]
    loss = axes[0]
    # Each run: its raw values faint, then their moving average.
    raw, smoothed = loss.lines[:2]
    assert raw.get_alpha() == 0.25 and list(raw.get_ydata()) == [10.0 / s for s in range(1, 41)]
    assert list(smoothed.get_ydata()) == pytest.approx(smooth(raw.get_ydata(), smoothing_weight(40)))
    assert shown_ticks(loss) == ["0", "10", "20", "30", "40"]
    assert shown_ticks(loss.child_axes[0]) == ["0", "20k", "40k"]  # 1000 tokens a step


def test_runs_at_different_token_rates_are_drawn_against_tokens(matplotlib, tmp_path, capsys):
    # An ablation at a fixed token budget: b sees twice the tokens per step, in half the steps.
    a = write_metrics(tmp_path / "a", [step_line(s, ["mlm"], tokens=1000) for s in (1, 2, 3, 4)])
    b = write_metrics(tmp_path / "b", [step_line(s, ["mlm"], tokens=2000) for s in (1, 2)])
    panels = plot_runs([a, b], tmp_path / "ab.png")
    assert {p.x for p in panels} == {"tokens"}
    assert panels[0].lines == {"a": ([1000, 2000, 3000, 4000], [10.0, 5.0, 10 / 3, 2.5]),
                               "b": ([2000, 4000], [10.0, 5.0])}
    out = tmp_path / "cli.png"
    assert main(["plot", str(a), str(b), "--out", str(out)]) == 0
    assert "4 panels (losses 2, training metrics 1, learning rate 1) against tokens seen, " \
           "2 run(s)" in capsys.readouterr().out


def test_train_plots_its_own_run_when_matplotlib_is_there(matplotlib, two_runs, tmp_path,
                                                           monkeypatch):
    messages = []
    out = plot_run_if_possible(two_runs[0], log=messages.append)
    assert out == two_runs[0] / "metrics.png"
    # roberta: loss and loss/mlm, mlm/accuracy, three eval metrics, lr in 3 columns
    assert png_size(out) == (3 * 370, 4 * 230 + 4 * 30 + 60)
    assert messages == [f"plot: {out}"]
    monkeypatch.setattr(plot, "matplotlib_installed", lambda: False)
    assert plot_run_if_possible(tmp_path) is None


def test_a_failed_plot_does_not_fail_the_run(matplotlib, tmp_path):
    messages = []
    assert plot_run_if_possible(tmp_path, log=messages.append) is None
    assert messages and "no plot of the run" in messages[0] and str(tmp_path) in messages[0]


def test_the_command_writes_the_plot(matplotlib, two_runs, tmp_path, capsys):
    out = tmp_path / "cli.png"
    assert main(["plot", *map(str, two_runs), "--out", str(out)]) == 0
    assert png_size(out) == (1850, 1100)
    assert capsys.readouterr().out == (
        f"wrote {out}: 11 panels (losses 3, training metrics 2, evaluation 5, learning rate 1) "
        f"against steps (tokens seen on top), 2 run(s)\n")


def test_an_unknown_format_or_a_missing_run_is_one_line(matplotlib, two_runs, tmp_path, capsys):
    assert main(["plot", str(two_runs[0]), "--out", str(tmp_path / "x.bmpz")]) == 2
    assert f"{tmp_path / 'x.bmpz'}: unknown image format" in capsys.readouterr().err
    assert main(["plot", str(tmp_path / "nope"), "--out", str(tmp_path / "x.png")]) == 2
    assert f"{tmp_path / 'nope'}: no such run directory" in capsys.readouterr().err


def test_an_out_that_cannot_be_written_is_one_line(matplotlib, two_runs, tmp_path, capsys):
    (tmp_path / "afile").write_text("mine")
    cases = [(tmp_path / "afile" / "x.png",
              f"cannot write the image ({tmp_path / 'afile'}: exists and is not a directory)")]
    if Path("/proc/self").is_dir():  # a file system where nothing can be created
        cases.append((Path("/proc/pretextual-plot.png"),
                      "cannot write the image (No such file or directory)"))
    for out, reason in cases:
        assert main(["plot", str(two_runs[0]), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err == f"pretextual: error: {out}: {reason}\n"
    assert (tmp_path / "afile").read_text() == "mine"


def test_without_matplotlib_the_command_says_what_to_install(two_runs, tmp_path, monkeypatch):
    monkeypatch.setattr(plot, "matplotlib_installed", lambda: False)
    with pytest.raises(PlotError, match=r"needs matplotlib: pip install 'pretextual\[plot\]'"):
        plot_runs(two_runs, tmp_path / "x.png")


def test_train_without_matplotlib_says_which_extra_to_install(corpus_file, cache_dir, tmp_path,
                                                              monkeypatch, capsys):
    monkeypatch.setattr(plot, "matplotlib_installed", lambda: False)
    overrides = [o for o in tiny_overrides(corpus_file, cache_dir, tmp_path / "run", steps=2)
                 if o != "trainer.plot=false"]
    assert main(["train", "roberta", *overrides]) == 0
    said = capsys.readouterr().out.splitlines()
    assert [line for line in said if line.startswith(("note: trainer.plot", "plot"))] == [
        "note: trainer.plot is on, but matplotlib is not installed, so this run draws no "
        "metrics.png: pip install 'pretextual[plot]' (or set trainer.plot=false)"]
    assert not (tmp_path / "run" / "metrics.png").exists()
