"""The wandb logger against the real wandb in offline mode: the run file W&B writes in
``<run dir>/wandb/offline-run-*/`` read back record by record (the history equal to
metrics.jsonl step by step, the config, the export's model artifact, the exit code), a
resumed run continuing the same W&B run, and a run that stopped on an error finished with
exit code 1 by the next run in the process."""

from __future__ import annotations

import json

import pytest

import pretextual
from logger_helpers import read_lines, wandb_history, wandb_records, wandb_run_file
from pretextual.core.trainer import Trainer
from pretextual.plugins.manager import Plugins

pytest.importorskip("wandb")

OFFLINE = ("trainer.loggers=[wandb]", "trainer.wandb_mode=offline")


class Interrupt:
    """Stops a run the way Ctrl-C does, at the metrics line of ``step``."""

    def __init__(self, step):
        self.step = step

    @pretextual.hookimpl
    def pretextual_on_step_end(self, step):
        if step == self.step:
            raise KeyboardInterrupt


def train(cfg, plugins=None, resume=False):
    lines = []
    Trainer(cfg, plugins, log=lines.append, resume=resume).train()
    return lines


def records_of(file, kind):
    return [getattr(r, kind) for r in wandb_records(file) if r.WhichOneof("record_type") == kind]


def assert_history_is_the_metrics(rows, lines):
    """W&B's row of each step holds the numbers of that step's metrics.jsonl lines: a
    step's training line and its evaluation share one row (time, which both have, keeps
    the evaluation's, written last)."""
    expected: dict[int, dict] = {}
    for line in lines:
        expected.setdefault(line["step"], {}).update(line)
    assert [row["_step"] for row in rows] == sorted(expected)
    for row in rows:
        for key, value in expected[row["_step"]].items():
            if key != "step":
                assert row[key] == pytest.approx(value, rel=1e-9), (row["_step"], key)


def test_an_offline_run_holds_the_history_config_and_export(tiny_config, tmp_path):
    cfg = tiny_config("roberta", *OFFLINE, "trainer.eval_every=2", "trainer.export=safetensors",
                      steps=4)
    lines = train(cfg)
    run_dir = tmp_path / "run"
    file = wandb_run_file(run_dir)
    run_id = (run_dir / "wandb_run_id").read_text().strip()
    assert file.name == f"run-{run_id}.wandb"
    assert (f"wandb: logging to run {run_id} (run) of project 'pretextual', offline mode, files "
            f"in {run_dir / 'wandb'}") in lines
    (run,) = records_of(file, "run")
    assert (run.run_id, run.display_name, run.project) == (run_id, "run", "pretextual")
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["trainer"]["max_steps"] == 4 and config["model"]["preset"] == "tiny"
    metrics = read_lines(run_dir)
    rows = wandb_history(file)
    assert [row["_step"] for row in rows] == [1, 2, 3, 4]
    assert {"eval/loss", "eval/mlm/accuracy"} <= set(rows[1]) and "eval/loss" not in rows[0]
    assert_history_is_the_metrics(rows, metrics)
    (artifact,) = records_of(file, "artifact")
    assert (artifact.name, artifact.type) == (f"model-{run_id}", "model")
    files = {entry.path for entry in artifact.manifest.contents}
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= files
    (exit_record,) = records_of(file, "exit")
    assert exit_record.exit_code == 0


def test_a_resumed_run_continues_the_same_wandb_run(tiny_config, tmp_path):
    train(tiny_config("roberta", *OFFLINE, steps=2))
    run_dir = tmp_path / "run"
    first_id = (run_dir / "wandb_run_id").read_text().strip()
    lines = train(tiny_config("roberta", *OFFLINE, "trainer.max_steps=4", steps=2), resume=True)
    assert any(line.startswith(f"wandb: continuing run {first_id} (run)") for line in lines)
    first, second = wandb_run_file(run_dir, 0), wandb_run_file(run_dir, 1)
    assert first.name == second.name == f"run-{first_id}.wandb"  # one run, in two parts
    metrics = read_lines(run_dir)
    assert [row["_step"] for row in wandb_history(first)] == [1, 2]
    assert [row["_step"] for row in wandb_history(second)] == [3, 4]
    assert_history_is_the_metrics(wandb_history(first) + wandb_history(second), metrics)
    (run,) = records_of(second, "run")
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["trainer"]["max_steps"] == 4


def test_a_run_stopped_by_an_error_is_finished_with_exit_code_1_by_the_next(tiny_config, tmp_path):
    plugins = Plugins()
    plugins.register(Interrupt(step=2), "interrupt")
    with pytest.raises(KeyboardInterrupt):
        train(tiny_config("roberta", *OFFLINE, steps=4), plugins)
    train(tiny_config("roberta", *OFFLINE, f"trainer.output_dir={tmp_path / 'next'}", steps=2))
    interrupted, following = wandb_run_file(tmp_path / "run"), wandb_run_file(tmp_path / "next")
    assert [r.exit_code for r in records_of(interrupted, "exit")] == [1]
    # the interrupting plugin, registered last, is called first: step 2 never reached W&B
    assert [row["_step"] for row in wandb_history(interrupted)] == [1]
    assert [r.exit_code for r in records_of(following, "exit")] == [0]
