"""The tensorboard logger: every metrics.jsonl line becomes scalars at its step, the writer
is flushed at checkpoints and closed at the last; without tensorboard the run says which
extra to install and writes nothing."""

import time

import pytest

from logger_helpers import read_lines
from pretextual.loggers import tensorboard
from pretextual.core.trainer import Trainer
from pretextual.plugins.manager import Plugins


class FakeWriter:
    """Records what a SummaryWriter is asked to do."""

    def __init__(self, path):
        self.path, self.scalars, self.flushes, self.closed = path, [], 0, False

    def add_scalar(self, tag, value, global_step):
        self.scalars.append((global_step, tag, value))

    def flush(self):
        self.flushes += 1

    def close(self):
        self.closed = True


def train_with_plugin(tiny_config, tmp_path, *overrides, steps=4, log=lambda *_: None):
    plugins = Plugins()
    plugins.register(tensorboard, name="tensorboard")
    cfg = tiny_config("roberta", "trainer.eval_every=2", "trainer.checkpoint_every=2", *overrides,
                      steps=steps)
    Trainer(cfg, plugins, log=log).train()
    return tmp_path / "run"


def test_every_metrics_line_goes_to_the_writer(tiny_config, tmp_path, monkeypatch):
    writers = []
    monkeypatch.setattr(tensorboard, "AVAILABLE", True)
    monkeypatch.setattr(tensorboard, "_open_writer", lambda path, first_step: writers.append(
        FakeWriter(path)) or writers[-1])
    run = train_with_plugin(tiny_config, tmp_path)
    (writer,) = writers
    assert writer.path == run / "tensorboard"
    expected = [(line["step"], key, value) for line in read_lines(run)
                for key, value in line.items() if key != "step"]
    assert writer.scalars == expected
    assert (writer.flushes, writer.closed) == (1, True)  # flushed at step 2, closed at step 4
    assert run / "tensorboard" not in tensorboard._writers


def test_a_writer_left_open_by_a_run_that_failed_is_not_reused(tiny_config, tmp_path, monkeypatch):
    writers = []
    monkeypatch.setattr(tensorboard, "AVAILABLE", True)
    monkeypatch.setattr(tensorboard, "_open_writer", lambda path, first_step: writers.append(
        FakeWriter(path)) or writers[-1])
    failed = Trainer(tiny_config("roberta", steps=4), log=lambda *_: None)
    tensorboard.pretextual_on_step_end(step=1, metrics={"loss": 1.0}, trainer=failed)
    run = train_with_plugin(tiny_config, tmp_path)  # a new run in the same directory
    stale, fresh = writers
    assert stale.closed and stale.scalars == [(1, "loss", 1.0)]
    assert fresh.closed and fresh.scalars and run / "tensorboard" not in tensorboard._writers


def test_without_tensorboard_nothing_is_written_and_the_run_says_which_extra_to_install(
        tiny_config, tmp_path, monkeypatch):
    monkeypatch.setattr(tensorboard, "AVAILABLE", False)
    lines = []
    run = train_with_plugin(tiny_config, tmp_path, log=lines.append)
    assert not (run / "tensorboard").exists()
    assert [line for line in lines if "tensorboard" in line] == [
        "note: trainer.loggers has tensorboard, but the tensorboard package is not installed, so "
        "this run logs no events: pip install 'pretextual[tensorboard]' (or leave tensorboard out "
        "of trainer.loggers)"]
    lines.clear()
    train_with_plugin(tiny_config, tmp_path, "trainer.loggers=[]",
                      "trainer.overwrite_output_dir=true", log=lines.append)
    assert not [line for line in lines if "tensorboard" in line]


def test_turned_off_nothing_is_written(tiny_config, tmp_path, monkeypatch):
    monkeypatch.setattr(tensorboard, "AVAILABLE", True)
    run = train_with_plugin(tiny_config, tmp_path, "trainer.loggers=[]")
    assert not (run / "tensorboard").exists()


def test_tensorboard_reads_back_the_metrics(tiny_config, tmp_path):
    """Of a run that replaced an earlier, longer one in its directory: the earlier run's
    events are purged, so each curve is this run's alone."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    train_with_plugin(tiny_config, tmp_path, "trainer.lr=1e-2", steps=6)
    # TensorBoard reads event files in name order: seconds since the epoch, then a counter
    # of writers in the process that sorts 10 before 9, so within one second it may read the
    # new run's file first and keep the old events. A second apart, the seconds decide.
    time.sleep(1.1)
    # logging from step 3 on: the earlier run's steps 1 and 2 must not show either
    run = train_with_plugin(tiny_config, tmp_path, "trainer.overwrite_output_dir=true",
                            "trainer.log_every=3")
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    lines = read_lines(run)
    for key in ("loss/mlm", "lr", "tokens", "eval/mlm/accuracy"):
        logged = [(l["step"], l[key]) for l in lines if key in l]
        assert [(e.step, e.value) for e in events.Scalars(key)] == \
            [(s, pytest.approx(v, rel=1e-6)) for s, v in logged]
