"""Every shipped recipe trains: each of its loss terms falls on held-out text.

The story corpus gives every objective something to learn (see write_story_corpus). Runs on
the embedded corpus, longer, are in docs/objectives.md.
"""

import pytest

from objective_corpora import write_story_corpus
from pretextual.core.config import load_config, recipe_names
from pretextual.core.trainer import Trainer
from run_helpers import tiny_overrides

STEPS = 900
FALL = 0.5
"""A term passes when its held-out loss at least halves; the pair terms start at chance, ln 2."""


@pytest.fixture(scope="module")
def story_corpus(tmp_path_factory):
    return write_story_corpus(tmp_path_factory.mktemp("stories") / "stories.txt")


@pytest.mark.parametrize("recipe", recipe_names())
def test_every_loss_term_falls(recipe, story_corpus, cache_dir, tmp_path):
    overrides = tiny_overrides(story_corpus, cache_dir, tmp_path / "run", STEPS) + [
        "data.batch_size=32", "trainer.warmup_steps=20", "data.eval_fraction=0.1",
        "trainer.eval_batches=8"]
    if load_config(recipe).trainer.phases:  # the same steps and length, in two phases
        overrides += [f"trainer.phases.0.steps={STEPS - 100}", "trainer.phases.0.max_seq_length=32",
                      "trainer.phases.1.steps=100", "trainer.phases.1.max_seq_length=32"]
    cfg = load_config(recipe, overrides)
    trainer = Trainer(cfg, log=lambda *_: None)
    before = trainer.evaluate()
    after = trainer.train()

    terms = {f"eval/loss/{name}" for name in cfg.objectives}
    assert {k for k in after if k.startswith("eval/loss/")} == terms
    fell = {term: (round(before[term], 3), round(after[term], 3)) for term in terms}
    assert all(end < FALL * start for start, end in fell.values()), fell
