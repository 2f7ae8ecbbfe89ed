"""The mlflow logger against the real MLflow: a tiny run read back with MlflowClient from
its SQLite store (status, parameters, every metric at its step as in metrics.jsonl, the
export's artifacts), a resumed run continuing the same MLflow run in the default store, and
a run that stopped on an error ended FAILED (by the next run in the process, or at the
process's exit)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import pretextual
from logger_helpers import read_lines
from pretextual.core.config import to_yaml
from pretextual.core.trainer import Trainer
from pretextual.plugins.manager import Plugins

pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

# MLflow's own SQLAlchemy models, not this code
pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy is deprecated")

KEYS = ("loss", "loss/mlm", "mlm/accuracy", "lr", "tokens", "eval/loss", "eval/mlm/accuracy")


class Interrupt:
    """Stops a run the way Ctrl-C does, after the metrics line of ``step``."""

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


def only_run(client):
    experiment = client.get_experiment_by_name("pretextual")
    (run,) = client.search_runs([experiment.experiment_id])
    return run


def history(client, run_id, key):
    return [(m.step, m.value) for m in client.get_metric_history(run_id, key)]


def logged(lines, key):
    return [(l["step"], pytest.approx(l[key], rel=1e-6)) for l in lines if key in l]


def test_a_run_is_read_back_from_its_tracking_store(tiny_config, tmp_path):
    uri = f"sqlite:///{tmp_path / 'store.db'}"
    cfg = tiny_config("roberta", "trainer.loggers=[mlflow]", f"trainer.mlflow_tracking_uri={uri}",
                      "trainer.eval_every=2", "trainer.export=safetensors", steps=4)
    lines = train(cfg)
    run_dir = tmp_path / "run"
    client = MlflowClient(tracking_uri=uri)
    run = only_run(client)
    run_id = run.info.run_id
    assert (run.info.status, run.info.run_name) == ("FINISHED", "run")
    assert (run_dir / "mlflow_run_id").read_text().strip() == run_id
    assert f"mlflow: logging to run {run_id} (run) of experiment 'pretextual' in {uri}" in lines
    params = run.data.params
    assert (params["trainer.max_steps"], params["trainer.loggers"]) == ("4", "['mlflow']")
    assert (params["model.preset"], params["objectives.mlm.weight"]) == ("tiny", "1.0")
    metrics = read_lines(run_dir)
    for key in KEYS:
        assert history(client, run_id, key) == logged(metrics, key), key
    assert [step for step, _ in history(client, run_id, "loss")] == [1, 2, 3, 4]
    assert [step for step, _ in history(client, run_id, "eval/loss")] == [2, 4]
    exported = {a.path for a in client.list_artifacts(run_id, "export")}
    assert {"export/model.safetensors", "export/config.json", "export/tokenizer.json"} <= exported
    assert "config.yaml" in {a.path for a in client.list_artifacts(run_id)}


def test_a_resumed_run_continues_the_same_mlflow_run_in_the_default_store(tiny_config, tmp_path):
    train(tiny_config("roberta", "trainer.loggers=[mlflow]", steps=2))
    run_dir = tmp_path / "run"
    first_id = (run_dir / "mlflow_run_id").read_text().strip()
    lines = train(tiny_config("roberta", "trainer.loggers=[mlflow]", "trainer.max_steps=4", steps=2),
                  resume=True)
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")  # beside the run dir
    run = only_run(client)
    assert (run.info.run_id, run.info.status) == (first_id, "FINISHED")
    assert any(line.startswith(f"mlflow: continuing run {first_id} (run)") for line in lines)
    metrics = read_lines(run_dir)
    assert [step for step, _ in history(client, first_id, "loss")] == [1, 2, 3, 4]
    assert history(client, first_id, "loss") == logged(metrics, "loss")
    # a parameter keeps its first value; config.yaml, uploaded again, has the resumed run's
    assert run.data.params["trainer.max_steps"] == "2"
    config = client.download_artifacts(first_id, "config.yaml", str(tmp_path / "downloaded"))
    assert "max_steps: 4" in open(config).read()


def test_a_run_stopped_by_an_error_is_ended_failed_by_the_next_run(tiny_config, tmp_path):
    uri = f"sqlite:///{tmp_path / 'store.db'}"
    plugins = Plugins()
    plugins.register(Interrupt(step=2), "interrupt")
    with pytest.raises(KeyboardInterrupt):
        train(tiny_config("roberta", "trainer.loggers=[mlflow]",
                          f"trainer.mlflow_tracking_uri={uri}", steps=4), plugins)
    client = MlflowClient(tracking_uri=uri)
    interrupted = only_run(client)
    assert interrupted.info.status == "RUNNING"  # no hook says the run ended
    train(tiny_config("roberta", "trainer.loggers=[mlflow]", f"trainer.mlflow_tracking_uri={uri}",
                      f"trainer.output_dir={tmp_path / 'next'}", steps=2))
    experiment = client.get_experiment_by_name("pretextual")
    status = {r.info.run_name: r.info.status for r in client.search_runs([experiment.experiment_id])}
    assert status == {"run": "FAILED", "next": "FINISHED"}
    # the interrupting plugin, registered last, is called first: step 2 never reached MLflow
    assert [step for step, _ in history(client, interrupted.info.run_id, "loss")] == [1]


def test_a_process_that_exits_mid_run_leaves_its_mlflow_run_failed(tiny_config, tmp_path):
    uri = f"sqlite:///{tmp_path / 'store.db'}"
    config = tmp_path / "config.yaml"
    config.write_text(to_yaml(tiny_config("roberta", "trainer.loggers=[mlflow]",
                                          f"trainer.mlflow_tracking_uri={uri}", steps=4)))
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from pretextual.core.config import load_config
        from pretextual.core.trainer import Trainer
        from pretextual.plugins.manager import Plugins
        from test_mlflow import Interrupt
        plugins = Plugins()
        plugins.register(Interrupt(step=2), "interrupt")
        Trainer(load_config({str(config)!r}), plugins, log=lambda *_: None).train()
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode != 0 and "KeyboardInterrupt" in result.stderr
    client = MlflowClient(tracking_uri=uri)
    run = only_run(client)
    assert run.info.status == "FAILED"
    assert [step for step, _ in history(client, run.info.run_id, "loss")] == [1]
