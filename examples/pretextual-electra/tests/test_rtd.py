"""The rtd objective on a tiny untrained encoder and a hand-made batch: no training run.

Run after installing the package: ``python -m pytest examples/pretextual-electra/tests``.
"""

from __future__ import annotations

import math

import pytest
import torch

from pretextual import BuildContext, ConfigError, StepInputs, Vocab
from pretextual.architectures import architecture, sized_config
from pretextual.architectures.common import count_parameters
from pretextual.plugins.manager import Plugins
from pretextual_electra.rtd import RTDOptions, build

VOCAB = Vocab(size=60, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4, special_ids=(0, 1, 2, 3, 4))


def make(mix=("mlm", "rtd"), arch="bert", **options):
    spec = architecture(arch)
    config = sized_config(spec, "tiny", {}, {}, vocab_size=VOCAB.size)
    objective = build(RTDOptions(**options), BuildContext(config, VOCAB, 32, True, objectives=mix))
    torch.manual_seed(0)
    encoder = spec.model(config)
    heads = torch.nn.ModuleDict({name: factory(encoder) for name, factory in objective.heads.items()})
    return objective, encoder, heads


def batch() -> dict[str, torch.Tensor]:
    """Four rows of 32 tokens, [CLS] ... [SEP], the last row with 12 padding positions."""
    ids = torch.randint(5, VOCAB.size, (4, 32), generator=torch.Generator().manual_seed(0))
    ids[:, 0], ids[:, -1] = VOCAB.cls_id, VOCAB.sep_id
    ids[3, 19], ids[3, 20:] = VOCAB.sep_id, VOCAB.pad_id
    attention = (ids != VOCAB.pad_id).long()
    special = ((ids == VOCAB.cls_id) | (ids == VOCAB.sep_id)).long()
    return {"input_ids": ids, "attention_mask": attention, "token_type_ids": torch.zeros_like(ids),
            "special_tokens_mask": special, "word_starts": torch.ones_like(ids)}


def run(objective, encoder, heads, masked_batch):
    output = encoder(masked_batch["input_ids"], masked_batch["attention_mask"],
                     masked_batch["token_type_ids"])
    return objective.loss(StepInputs(masked_batch, output, heads, encoder))


def test_registered_through_the_entry_point_only():
    assert Plugins().owner("objective", "rtd").package == "pretextual-electra"


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_untrained_losses_are_chance_and_metrics_count_positions(arch):
    objective, encoder, heads = make(masking="own", arch=arch)
    masked = objective.batch_transform(batch(), torch.Generator().manual_seed(1))
    assert (masked["input_ids"][masked["mlm_labels"] >= 0] == VOCAB.mask_id).all()  # ELECTRA: all [MASK]
    out = run(objective, encoder, heads, masked)
    assert out.loss.item() == pytest.approx(math.log(2), abs=0.02)  # one logit near 0 per position
    assert out.aux_losses["generator"].item() == pytest.approx(math.log(VOCAB.size), abs=0.2)
    real = int(masked["attention_mask"].sum())  # 4 * 32 - 12 = 116
    n_masked = int((masked["mlm_labels"] >= 0).sum())  # 3 * round(0.15 * 30) + round(0.15 * 18)
    assert (real, n_masked) == (116, 3 * 4 + 3)  # torch.round rounds 4.5 to even
    assert 0 < out.metrics["replaced"].item() * real <= n_masked
    correct = out.metrics["accuracy"].item() * real  # a share of the real positions
    assert correct == pytest.approx(round(correct), abs=1e-3) and 0 < round(correct) <= real


def test_no_gradient_flows_through_the_sampling():
    objective, encoder, heads = make(masking="own")
    out = run(objective, encoder, heads, objective.batch_transform(batch(), torch.Generator().manual_seed(1)))
    out.loss.backward(retain_graph=True)
    generator = heads["rtd_generator"]
    assert generator.project.weight.grad is None  # the discriminator's loss never reaches the generator
    assert encoder.encoder.layer[0].attention.self.query.weight.grad.abs().sum() > 0  # the discriminator's
    out.aux_losses["generator"].backward()
    assert generator.project.weight.grad.abs().sum() > 0


def test_generator_shares_the_embeddings_and_is_smaller():
    _, encoder, heads = make(generator_size_divisor=4)
    generator = heads["rtd_generator"]
    assert generator.word_embeddings is encoder.get_input_embeddings()
    assert not any(name.startswith("word_embeddings") for name, _ in generator.named_parameters())
    body = count_parameters(encoder.encoder)
    assert count_parameters(generator.encoder) < body / 10  # width / 4: about 1/16 of the layers' weights


def test_masking_mix_leaves_the_batch_to_the_mlm_objective():
    objective, encoder, heads = make()
    assert objective.batch_transform is None
    with pytest.raises(ConfigError, match="objectives.rtd.masking=own"):
        make(mix=("rtd",))


@pytest.mark.parametrize("options, key", [({"generator_size_divisor": 3}, "generator_size_divisor"),
                                          ({"masking": "both"}, "masking"),
                                          ({"mask_prob": 1.5}, "mask_prob")])
def test_bad_options_name_the_key(options, key):
    with pytest.raises(ConfigError, match=f"objectives.rtd.{key}"):
        make(**options)
