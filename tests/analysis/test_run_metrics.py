"""metrics.jsonl read into series: tokens seen, wall time and throughput rebuilt from the
per-step lines, and one clear error per unreadable run directory."""

import pytest

from analysis_helpers import RUN_A, RUN_B, read_lines, write_metrics
from pretextual.analysis.metrics import RunError, read_run


def test_series_are_placed_at_steps_and_at_tokens_seen(tmp_path):
    run = read_run(write_metrics(tmp_path / "a", RUN_A))
    loss = run.series("loss")
    assert (loss.steps, loss.tokens, loss.values) == ([1, 2, 3, 4], [100, 220, 300, 400],
                                                       [4.0, 3.0, 2.5, 2.0])
    accuracy = run.series("eval/mlm/accuracy")
    assert (accuracy.steps, accuracy.tokens, accuracy.values) == ([2, 4], [220, 400], [0.25, 0.125])
    assert run.eval_keys() == ["eval/loss", "eval/mlm/accuracy"]
    assert (run.last_step, run.tokens_seen, run.wall_time, run.tokens_per_s) == (4, 400, 10, 40)


def test_a_logged_step_stands_for_the_unlogged_steps_before_it(tmp_path):
    run = read_run(write_metrics(tmp_path / "b", RUN_B))
    assert run.series("loss").tokens == [100, 220]
    assert run.tokens_at([1, 3]) == [50, 160]  # between logged steps: interpolated
    assert (run.tokens_seen, run.wall_time) == (220, pytest.approx(9.0))


def test_a_time_key_on_the_lines_is_the_wall_time(tmp_path):
    lines = [{**line, "time": 1.5 * line["step"]} for line in RUN_A]
    assert read_run(write_metrics(tmp_path / "t", lines)).wall_time == 6.0


def test_a_real_run_reads_back_as_written(two_runs):
    run = read_run(two_runs[0])
    lines = read_lines(two_runs[0])
    steps = [l for l in lines if "loss" in l]
    assert run.series("loss/mlm").values == [l["loss/mlm"] for l in steps]
    assert run.tokens_seen == sum(l["tokens"] for l in steps)
    assert [l["step"] for l in run.evals] == [3, 6]
    # The trainer stamps every line with "time" (seconds since the start): the last is the wall time.
    assert run.wall_time == max(l["time"] for l in lines)


@pytest.mark.parametrize("content, message", [
    (None, "no such run directory"),
    ("", "holds no step line"),
    ('{"step": 1, "loss": 2.0, "tokens": 5, "tokens_per_s": 1.0}\nnot json\n',
     "metrics.jsonl:2: not valid JSON"),
    ('{"loss": 2.0}\n', "metrics.jsonl:1: expected an object with an integer 'step'"),
    ('{"step": 1, "loss": 2.0, "tokens": 5}\n', "metrics.jsonl:1: step line without tokens_per_s"),
])
def test_unreadable_runs_are_one_clear_error(tmp_path, content, message):
    run_dir = tmp_path / "run"
    if content is not None:
        run_dir.mkdir()
        (run_dir / "metrics.jsonl").write_text(content)
    with pytest.raises(RunError, match=message) as error:
        read_run(run_dir)
    assert str(run_dir) in str(error.value)


def test_a_directory_without_metrics_says_so(tmp_path):
    with pytest.raises(RunError, match=r"no metrics\.jsonl"):
        read_run(tmp_path)


def test_eval_lines_without_a_step_line_at_the_same_step_still_get_tokens(tmp_path):
    lines = RUN_B + [{"step": 3, "eval/loss": 4.7}]  # evaluated at a step that was not logged
    run = read_run(write_metrics(tmp_path / "b", lines))
    assert run.series("eval/loss").tokens == [220, 160]
