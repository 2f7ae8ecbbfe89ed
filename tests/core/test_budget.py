"""trainer.max_tokens and trainer.max_time: a run stops at the step that reaches its token
budget or passes its time budget, its schedule sized to it, and resumes exactly."""

import json
import re
import shutil

import numpy as np
import pytest

from pretextual.cli import main
from pretextual.core.budget import parse_duration
from pretextual.core.config import load_config
from pretextual.errors import ConfigError
from run_helpers import final_weights, tiny_overrides


def _records(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _train(corpus_file, cache_dir, run, *extra, steps=1000):
    overrides = tiny_overrides(corpus_file, cache_dir, run, steps)
    assert main(["train", "roberta", *overrides, *extra]) == 0


def test_a_token_budget_stops_at_the_step_that_reaches_it(corpus_file, cache_dir, tmp_path, capsys):
    run = tmp_path / "run"
    _train(corpus_file, cache_dir, run, "trainer.max_tokens=3000", "trainer.checkpoint_every=1000")
    said = "".join(capsys.readouterr())
    planned = re.search(r"trainer.max_tokens=3,000: about (\d+) steps", said).group(1)
    assert f"| {planned} steps x 8 examples" in said  # the data line reads the budget's steps
    steps = [r for r in _records(run) if "loss" in r]
    tokens = np.cumsum([r["tokens"] for r in steps])
    assert tokens[-1] >= 3000 > tokens[-2]
    meta = json.loads(next((run / "checkpoints").glob("step-*/trainer.json")).read_text())
    assert meta["tokens"] == tokens[-1] and meta["step"] == len(steps)
    # the schedule was sized to the steps: the learning rate has decayed to near zero
    planned = meta["config"]["trainer"]["max_steps"]
    assert abs(planned - len(steps)) <= 1 and steps[-1]["lr"] < 0.2 * max(r["lr"] for r in steps)


def test_a_token_budget_resumes_exactly(corpus_file, cache_dir, tmp_path):
    budget = ["trainer.max_tokens=2500", "trainer.checkpoint_every=4"]
    _train(corpus_file, cache_dir, tmp_path / "straight", *budget)
    resumed = tmp_path / "resumed"
    _train(corpus_file, cache_dir, resumed, *budget)
    newest = sorted((resumed / "checkpoints").iterdir())[-1]
    shutil.rmtree(newest)  # as if the run had stopped after the checkpoint before
    _train(corpus_file, cache_dir, resumed, *budget, "--resume")
    a, b = final_weights(tmp_path / "straight"), final_weights(resumed)
    assert all(np.array_equal(a[k].numpy(), b[k].numpy()) for k in a)
    assert [r["tokens"] for r in _records(resumed) if "loss" in r] == \
           [r["tokens"] for r in _records(tmp_path / "straight") if "loss" in r]


def test_a_time_budget_stops_within_one_step_of_it(corpus_file, cache_dir, tmp_path, capsys):
    run = tmp_path / "run"
    _train(corpus_file, cache_dir, run, "trainer.max_time=6s")
    times = [r["time"] for r in _records(run) if "loss" in r]
    assert times[-1] >= 6 > times[-2]  # the first step to end past it is the last
    assert "trainer.max_time=6s: the steps and the schedule's length follow from the measured " \
           "rate" in capsys.readouterr().out


def test_durations_and_bad_budgets():
    assert [parse_duration(d) for d in ("90", "90s", "1.5m", "2h", "1d")] == [90, 90, 90, 7200, 86400]
    for bad in ("0", "-5", "2 weeks", "h"):
        with pytest.raises(ConfigError, match="^trainer.max_time: expected a positive duration"):
            load_config("roberta", [f"trainer.max_time={bad}"])
    with pytest.raises(ConfigError, match="^trainer.max_tokens and trainer.max_time: give one"):
        load_config("roberta", ["trainer.max_tokens=10", "trainer.max_time=1h"])
    with pytest.raises(ConfigError, match="^trainer.max_tokens must be positive, got 0$"):
        load_config("roberta", ["trainer.max_tokens=0"])
