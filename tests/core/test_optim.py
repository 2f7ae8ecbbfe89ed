"""Optimizers and learning-rate schedules by name: each schedule's values at chosen steps,
a wsd run resumed from its stable phase decaying toward a new end, Adafactor training."""

import json
import math

import pytest
import torch

from pretextual.cli import main
from pretextual.core import config_checks
from pretextual.core.config import load_config
from pretextual.core.optim import DECAY_SHAPES, LR_SCHEDULES, ScheduleSettings
from pretextual.core.trainer import Trainer
from pretextual.errors import ConfigError
from pretextual.plugins.api import LRScheduleSpec, OptimizerSpec
from pretextual.plugins.hookspecs import hookimpl
from pretextual.plugins.manager import Plugins
from run_helpers import tiny_overrides


def values(name, steps, **settings):
    factor = LR_SCHEDULES[name](ScheduleSettings(**{"warmup_steps": 10, "max_steps": 110,
                                                    **settings}))
    return [round(factor(s), 6) for s in steps]


STEPS = [0, 4, 9, 10, 35, 60, 85, 109, 110]


def test_every_schedule_at_chosen_steps():
    assert values("linear", STEPS) == [0.1, 0.5, 1.0, 1.0, 0.75, 0.5, 0.25, 0.01, 0.0]
    assert values("linear", STEPS, min_lr_ratio=0.1) == [0.1, 0.5, 1.0, 1.0, 0.775, 0.55, 0.325,
                                                          0.109, 0.1]
    half_cos = [round(0.5 * (1 + math.cos(math.pi * x)), 6) for x in (0.25, 0.5, 0.75)]
    assert values("cosine", [0, 10, 35, 60, 85, 110]) == [0.1, 1.0, *half_cos, 0.0]
    assert values("constant", [0, 9, 10, 109]) == [0.1, 1.0, 1.0, 1.0]
    assert values("inverse_sqrt", [0, 9, 10, 39, 159]) == [0.1, 1.0, round(math.sqrt(10 / 11), 6),
                                                           0.5, 0.25]
    # wsd: the peak until the last 20 steps (decay_steps), then down to min_lr_ratio
    assert values("wsd", [0, 10, 89, 90, 95, 100, 110], decay_steps=20) == [
        0.1, 1.0, 1.0, 1.0, 0.75, 0.5, 0.0]
    assert values("wsd", [88, 99, 110], decay_fraction=0.2, decay_shape="1-sqrt") == [  # 22 steps
        1.0, round(1 - math.sqrt(0.5), 6), 0.0]
    assert values("wsd", [90, 100, 110], decay_steps=20, decay_shape="cosine",
                  min_lr_ratio=0.2) == [1.0, 0.6, 0.2]


def test_the_config_knows_the_decay_shapes_optim_draws():
    assert set(config_checks.DECAY_SHAPES) == set(DECAY_SHAPES)


def _lrs(run):
    return {r["step"]: r["lr"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if "lr" in r}


def test_a_stable_wsd_checkpoint_decays_toward_a_new_end(corpus_file, cache_dir, tmp_path):
    run = tmp_path / "run"
    wsd = ["trainer.lr_schedule=wsd", "trainer.warmup_steps=2", "trainer.lr=1e-3"]
    assert main(["train", "roberta", *tiny_overrides(corpus_file, cache_dir, run, 6), *wsd,
                 "trainer.decay_steps=0"]) == 0  # no decay yet: a stable checkpoint at step 6
    assert _lrs(run) == {1: 5e-4, 2: 1e-3, 3: 1e-3, 4: 1e-3, 5: 1e-3, 6: 1e-3}
    assert main(["train", "roberta", *tiny_overrides(corpus_file, cache_dir, run, 10), *wsd,
                 "trainer.decay_steps=4", "--resume"]) == 0
    lrs = _lrs(run)
    assert [round(lrs[s], 9) for s in range(7, 11)] == [1e-3, 7.5e-4, 5e-4, 2.5e-4]


def test_adafactor_trains(corpus_file, cache_dir, tmp_path):
    run = tmp_path / "run"
    assert main(["train", "roberta", *tiny_overrides(corpus_file, cache_dir, run, 12),
                 "trainer.optimizer=adafactor", "trainer.lr=1e-2"]) == 0
    losses = [r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
              if "loss" in r]
    assert len(losses) == 12 and sum(losses[-3:]) / 3 < sum(losses[:3]) / 3


@pytest.mark.parametrize("override, message", [
    ("trainer.decay_shape=sqrt", "trainer.decay_shape must be one of linear, cosine, 1-sqrt, got 'sqrt'"),
    ("trainer.min_lr_ratio=2", "trainer.min_lr_ratio must be in [0, 1], got 2.0"),
    ("trainer.decay_steps=5000", "trainer.decay_steps must be in [0, trainer.max_steps=1000], got 5000"),
])
def test_bad_schedule_keys_are_one_line(override, message):
    with pytest.raises(ConfigError) as error:
        load_config("roberta", [override])
    assert str(error.value) == message


def test_an_unknown_optimizer_or_schedule_names_the_known_ones(corpus_file, cache_dir, tmp_path,
                                                               capsys):
    fast = tiny_overrides(corpus_file, cache_dir, tmp_path / "run", 2)
    assert main(["train", "roberta", *fast, "trainer.optimizer=lamb"]) == 2
    assert capsys.readouterr().err == ("pretextual: error: trainer.optimizer: no plugin registers "
                                       "an optimizer named 'lamb' (known: adafactor, adamw)\n")
    assert main(["train", "roberta", *fast, "trainer.lr_schedule=poly"]) == 2
    assert "known: constant, cosine, inverse_sqrt, linear, wsd)" in capsys.readouterr().err


class Lion:
    """A plugin adding an optimizer and a schedule by name, as a package would."""

    @hookimpl
    def pretextual_register_optimizers(self, register):
        register(OptimizerSpec(name="sgd-momentum", build=lambda groups, t: torch.optim.SGD(
            groups, lr=t.lr, momentum=0.9)))

    @hookimpl
    def pretextual_register_lr_schedules(self, register):
        register(LRScheduleSpec(name="halving", build=lambda s: lambda step: 0.5 ** (step // 2)))


def test_a_plugin_registers_an_optimizer_and_a_schedule(corpus_file, cache_dir, tmp_path):
    plugins = Plugins()
    plugins.register(Lion(), name="lion")
    cfg = load_config("roberta", tiny_overrides(corpus_file, cache_dir, tmp_path / "run", 6)
                      + ["trainer.optimizer=sgd-momentum", "trainer.lr_schedule=halving",
                         "trainer.lr=0.1"])
    trainer = Trainer(cfg, plugins, log=lambda *_: None)
    assert isinstance(trainer.optimizer, torch.optim.SGD)
    trainer.train()
    assert _lrs(tmp_path / "run") == {1: 0.1, 2: 0.1, 3: 0.05, 4: 0.05, 5: 0.025, 6: 0.025}
    assert plugins.info["lion"].optimizers == ["sgd-momentum"]
    assert plugins.info["lion"].lr_schedules == ["halving"]
