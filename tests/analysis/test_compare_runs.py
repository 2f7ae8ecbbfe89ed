"""pretextual compare: final and best eval metrics, tokens seen, wall time and tokens/s of
each run, checked against runs whose every number is known and against real runs."""

import json

from analysis_helpers import RUN_A, RUN_B, read_lines, write_metrics
from pretextual.analysis.compare import compare
from pretextual.cli import main

EXPECTED = """\
                                        a                 b
steps                                   4                 4
tokens seen                           400               220
wall time (s)                        10.0               9.0
tokens/s                               40                24
loss start -> end        4.0000 -> 2.0000  5.0000 -> 4.0000
loss/mlm start -> end    4.0000 -> 2.0000  5.0000 -> 4.0000
eval/loss final                    3.0000            4.5000
eval/loss best                  3.0000 @4         4.5000 @4
eval/mlm/accuracy final            0.1250               n/a
eval/mlm/accuracy best          0.2500 @2               n/a
"""


def test_the_table_of_two_known_runs(tmp_path, capsys):
    a, b = write_metrics(tmp_path / "a", RUN_A), write_metrics(tmp_path / "b", RUN_B)
    assert main(["compare", str(a), str(b)]) == 0
    assert capsys.readouterr().out == EXPECTED


def test_training_losses_are_averaged_over_a_tenth_of_the_steps_at_each_end(tmp_path):
    lines = [{"step": k, "loss": float(k), "loss/nsp": 100.0 - k, "tokens": 10,
              "tokens_per_s": 10.0} for k in range(1, 21)]
    lines[4]["loss/nsp"] = float("nan")  # a skipped non-finite step is left out
    (summary,) = compare([write_metrics(tmp_path / "run", lines)])
    assert summary.train == {"loss": (1.5, 19.5), "loss/nsp": (98.5, 80.5)}


def test_markdown_table(tmp_path, capsys):
    a, b = write_metrics(tmp_path / "a", RUN_A), write_metrics(tmp_path / "b", RUN_B)
    assert main(["compare", str(a), str(b), "--markdown"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["|  | a | b |", "| --- | ---: | ---: |"]
    assert "| eval/mlm/accuracy best | 0.2500 @2 | n/a |" in lines


def test_two_real_runs_match_their_metrics(two_runs, capsys):
    assert main(["compare", *map(str, two_runs), "--json"]) == 0
    summaries = json.loads(capsys.readouterr().out)
    for summary, run in zip(summaries, two_runs):
        lines = read_lines(run)
        steps = [l for l in lines if "loss" in l]
        evals = [l for l in lines if "eval/loss" in l]
        assert summary["label"] == run.name
        assert summary["steps"] == steps[-1]["step"]
        assert summary["tokens"] == sum(l["tokens"] for l in steps)
        assert summary["wall_time"] == max(l["time"] for l in lines)
        assert summary["final"] == {k: v for k, v in evals[-1].items() if k.startswith("eval/")}
        best = min(evals, key=lambda l: l["eval/loss"])
        assert summary["best"]["eval/loss"] == [best["eval/loss"], best["step"]]
    assert main(["compare", *map(str, two_runs)]) == 0
    text = capsys.readouterr().out
    tokens = [f"{sum(l['tokens'] for l in read_lines(r) if 'loss' in l):,}" for r in two_runs]
    assert text.splitlines()[2].split() == ["tokens", "seen", *tokens]


def test_a_missing_run_is_one_line(tmp_path, capsys):
    assert main(["compare", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (f"pretextual: error: {tmp_path}: no metrics.jsonl (not a "
                                       f"run directory, or no step logged yet)\n")
