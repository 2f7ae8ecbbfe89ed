"""Schedules for an objective's numeric options: objectives.mlm.mask_prob from 0.30 down
to 0.15 masks 30% of the tokens of the first batches and 15% of the last, the batch
transform seeing each step's value; logged; resumed exactly; bad schedules one line."""

import json
import shutil

import numpy as np
import pytest

from pretextual.cli import main
from pretextual.core.config import load_config
from pretextual.core.mix import check_objectives
from pretextual.core.trainer import Trainer
from pretextual.errors import ConfigError
from pretextual.plugins.manager import Plugins
from run_helpers import final_weights, tiny_overrides

RAMP = "objectives.mlm.schedules.mask_prob={schedule: linear, start: 0.3, steps: 20}"


def _masked_share(batch, vocab) -> float:
    """Labelled tokens over ordinary (non-special, non-padding) tokens of a batch."""
    labelled = int((batch["mlm_labels"] != -100).sum())
    special = np.isin(batch["input_ids"].numpy(), list(vocab.special_ids)) & \
        (batch["mlm_labels"].numpy() == -100)
    ordinary = int(batch["attention_mask"].sum()) - int(special.sum())
    return labelled / ordinary


def test_the_mask_rate_follows_its_schedule(corpus_file, cache_dir, tmp_path):
    def trainer(*extra):
        cfg = load_config("roberta", tiny_overrides(corpus_file, cache_dir, tmp_path / "run", 20)
                          + ["data.batch_size=32", *extra])
        return Trainer(cfg, log=lambda *_: None)
    ramp = trainer(RAMP, "objectives.mlm.mask_prob=0.15")
    at = {p: trainer(f"objectives.mlm.mask_prob={p}") for p in (0.3, 0.225, 0.15)}
    # batch k of step k is masked exactly as a run at that step's constant rate masks it
    for k, p in ((0, 0.3), (10, 0.225), (20, 0.15), (35, 0.15)):
        assert ramp.train_batches[k]["mlm_labels"].equal(at[p].train_batches[k]["mlm_labels"])
    share = [np.mean([_masked_share(ramp.train_batches[k], ramp.vocab) for k in ks])
             for ks in (range(0, 3), range(30, 33))]
    assert share[0] / share[1] == pytest.approx(2.0, rel=0.1)  # 30% of the tokens, then 15%
    # held-out batches are masked at the configured rate, for evaluations to compare
    assert ramp.eval_batches[0]["mlm_labels"].equal(at[0.15].eval_batches[0]["mlm_labels"])


def test_the_value_is_logged_and_a_resume_is_exact(corpus_file, cache_dir, tmp_path):
    def train(run, *extra):
        assert main(["train", "roberta", *tiny_overrides(corpus_file, cache_dir, run, 8), RAMP,
                     "objectives.mlm.schedules.mask_prob.steps=8", "trainer.checkpoint_every=4",
                     *extra]) == 0
    train(tmp_path / "straight")
    records = [json.loads(line) for line in (tmp_path / "straight" / "metrics.jsonl")
               .read_text().splitlines() if '"loss"' in line]
    assert [round(r["mlm/mask_prob"], 6) for r in records] == \
           [round(0.3 + (0.15 - 0.3) * s / 8, 6) for s in range(8)]
    resumed = tmp_path / "resumed"
    train(resumed)
    shutil.rmtree(resumed / "checkpoints" / "step-0000008")
    train(resumed, "--resume")
    a, b = final_weights(tmp_path / "straight"), final_weights(resumed)
    assert all(np.array_equal(a[k].numpy(), b[k].numpy()) for k in a)


@pytest.mark.parametrize("override, message", [
    ("objectives.mlm.schedules.masks={start: 0.3, steps: 10}",
     "objectives.mlm.schedules.masks: mlm has no numeric option 'masks' (its numeric options: "
     "mask_prob, mask_ratio, random_ratio)"),
    ("objectives.mlm.schedules.mask_prob={schedule: cosine, start: 0.3, steps: 10}",
     "objectives.mlm.schedules.mask_prob.schedule: must be linear or step, got 'cosine'"),
    ("objectives.mlm.schedules.mask_prob={start: 0.3}",
     "objectives.mlm.schedules.mask_prob.steps must be positive, got 0"),
])
def test_bad_option_schedules_are_one_line(override, message):
    with pytest.raises(ConfigError) as error:
        check_objectives(load_config("roberta", [override]).objectives, Plugins())
    assert str(error.value) == message
