"""The training hooks, each exercised by an in-test plugin: logging, early stopping,
a custom learning-rate schedule, checkpoint notifications."""

from __future__ import annotations

from pathlib import Path

import pytest

import pretextual
from pretextual.plugins.manager import Plugins


class Recorder:
    """Collects what each training hook receives."""

    def __init__(self):
        self.steps: list[tuple[int, dict]] = []
        self.evals: list[tuple[int, dict]] = []
        self.checkpoints: list[tuple[int, str, bool]] = []

    @pretextual.hookimpl
    def pretextual_on_step_end(self, step, metrics):
        self.steps.append((step, dict(metrics)))

    @pretextual.hookimpl
    def pretextual_on_eval(self, step, metrics, trainer):
        self.evals.append((trainer.step, dict(metrics)))

    @pretextual.hookimpl
    def pretextual_on_checkpoint(self, step, path):
        self.checkpoints.append((step, path, (Path(path) / "model.safetensors").is_file()))


class OnlyMetrics:
    """Names one argument of a three-argument hook: pluggy passes just that one."""

    def __init__(self):
        self.losses: list[float] = []

    @pretextual.hookimpl
    def pretextual_on_step_end(self, metrics):
        self.losses.append(metrics["loss"])


def test_step_end_eval_and_checkpoint_hooks_see_the_run(train, tmp_path):
    plugins, recorder, only_metrics = Plugins(), Recorder(), OnlyMetrics()
    plugins.register(recorder)
    plugins.pm.register(only_metrics)  # straight on pluggy's manager, as pytest's tests do
    records = train(plugins, "trainer.eval_every=2", "trainer.checkpoint_every=2", steps=4)
    plugins.pm.unregister(only_metrics)

    logged = [r for r in records if "loss" in r]
    assert recorder.steps == [(r["step"], r) for r in logged]  # exactly the metrics.jsonl lines
    assert only_metrics.losses == [r["loss"] for r in logged]
    assert {"loss", "loss/mlm", "weight/mlm", "mlm/accuracy", "lr", "tokens_per_s"} <= set(logged[0])

    evals = [r for r in records if "eval/loss" in r]
    assert recorder.evals == [(r["step"], {k: v for k, v in r.items() if k != "step"}) for r in evals]
    assert [step for step, _ in recorder.evals] == [2, 4]
    assert recorder.evals[0][1]["eval/loss"] == pytest.approx(recorder.evals[0][1]["eval/loss/mlm"])

    run = tmp_path / "run" / "checkpoints"
    assert recorder.checkpoints == [(2, str(run / "step-0000002"), True),
                                    (4, str(run / "step-0000004"), True)]


class EarlyStopping:
    """Stops when the loss has not improved on its best by ``min_delta`` for ``patience`` steps."""

    def __init__(self, patience: int, min_delta: float):
        self.patience, self.min_delta = patience, min_delta
        self.best, self.bad_steps = float("inf"), 0

    @pretextual.hookimpl
    def pretextual_on_step_end(self, metrics, trainer):
        if metrics["loss"] < self.best - self.min_delta:
            self.best, self.bad_steps = metrics["loss"], 0
        else:
            self.bad_steps += 1
        if self.bad_steps >= self.patience:
            trainer.should_stop = True


def test_an_early_stopping_plugin_ends_the_run_with_an_eval_and_a_checkpoint(train):
    plugins, recorder = Plugins(), Recorder()
    plugins.register(EarlyStopping(patience=1, min_delta=100.0))  # no step improves by 100: stop at 2
    plugins.register(recorder)
    records = train(plugins, steps=20)
    assert [r["step"] for r in records if "loss" in r] == [1, 2]
    assert [step for step, _ in recorder.evals] == [2]
    assert [step for step, _, _ in recorder.checkpoints] == [2]


class HalveLearningRate:
    """A custom schedule: halve the peak learning rate once, after step ``at``."""

    def __init__(self, at: int):
        self.at = at

    @pretextual.hookimpl
    def pretextual_on_step_end(self, step, trainer):
        if step == self.at:
            trainer.scheduler.base_lrs = [lr / 2 for lr in trainer.scheduler.base_lrs]


def test_a_schedule_plugin_changes_the_learning_rate_from_the_next_step(train):
    plugins = Plugins()
    plugins.register(HalveLearningRate(at=2))
    records = train(plugins, "trainer.lr=1e-3", steps=6)
    # Warm-up over 2 steps, then linear decay to 0 at step 6; the rate logged at step s was
    # set after step s-1, so the halving made after step 2 shows from step 4 on.
    expected = [1e-3 * 0.5, 1e-3, 1e-3, 0.5e-3 * 0.75, 0.5e-3 * 0.5, 0.5e-3 * 0.25]
    assert [r["lr"] for r in records if "loss" in r] == pytest.approx(expected)
