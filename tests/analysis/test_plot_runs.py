"""pretextual plot: valid PNGs of the expected size, one panel per metric against steps and
against tokens, holding exactly the numbers of metrics.jsonl."""

from itertools import accumulate
from pathlib import Path

import pytest

from analysis_helpers import png_size, read_lines
from pretextual.analysis import plot
from pretextual.analysis.plot import PlotError, plot_run_if_possible, plot_runs
from pretextual.cli import main

# roberta (run a) logs mlm only; bert (run b) adds nsp. Each metric gets a row.
METRICS = ["loss", "loss/mlm", "loss/nsp", "eval/loss", "eval/loss/mlm", "eval/mlm/accuracy",
           "eval/loss/nsp", "eval/nsp/accuracy"]


@pytest.fixture
def matplotlib():
    return pytest.importorskip("matplotlib")


def expected_lines(run_dir, metric: str, x: str) -> tuple[list, list]:
    """A metric's points read straight from metrics.jsonl: x is the step or the tokens seen."""
    lines = read_lines(run_dir)
    steps = [l for l in lines if "loss" in l]
    seen = dict(zip([l["step"] for l in steps], accumulate(l["tokens"] for l in steps)))
    points = [l for l in lines if metric in l]
    return ([l["step"] if x == "step" else seen[l["step"]] for l in points],
            [l[metric] for l in points])


def test_two_runs_overlaid_one_panel_per_metric_and_axis(matplotlib, two_runs, tmp_path):
    out = tmp_path / "plots" / "runs.png"
    panels = plot_runs(two_runs, out)
    assert png_size(out) == (2 * 450, len(METRICS) * 300)
    assert [(p.metric, p.x) for p in panels] == [(m, x) for m in METRICS
                                                  for x in ("step", "tokens")]
    for panel in panels:
        expected = {label: expected_lines(run, panel.metric, panel.x)
                    for label, run in zip("ab", two_runs)}
        assert panel.lines == {k: v for k, v in expected.items() if v[1]}, panel
    assert set(panels[METRICS.index("loss/nsp") * 2].lines) == {"b"}
    assert [len(p.lines["a"][0]) for p in panels if p.metric == "eval/loss"] == [2, 2]


def test_train_plots_its_own_run_when_matplotlib_is_there(matplotlib, two_runs, tmp_path,
                                                           monkeypatch):
    messages = []
    out = plot_run_if_possible(two_runs[0], log=messages.append)
    assert out == two_runs[0] / "metrics.png"
    assert png_size(out) == (900, 5 * 300)  # loss, loss/mlm and three eval metrics
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
    assert png_size(out) == (900, len(METRICS) * 300)
    assert f"wrote {out}: {len(METRICS)} metrics" in capsys.readouterr().out


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
