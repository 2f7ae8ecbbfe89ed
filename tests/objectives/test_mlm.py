"""MLM: the worked example, 80/10/10 statistics, dynamic and reproducible masks."""

import math

import pytest
import torch
from torch import nn

from pretextual.core.data import collate
from pretextual.architectures.common import EncoderOutput
from pretextual.core.mix import check_objectives
from pretextual.errors import ConfigError
from pretextual.plugins.api import BuildContext, StepInputs, Vocab
from pretextual.plugins.manager import Plugins
from pretextual.architectures.bert import preset_config

VOCAB = Vocab(size=1000, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4, special_ids=(0, 1, 2, 3, 4))


def build_mlm(**options):
    spec = Plugins().objective("mlm")
    context = BuildContext(preset_config("tiny", vocab_size=VOCAB.size), VOCAB, 128, True)
    return spec.build(spec.options(**options), context)


def random_batch(rows=64, length=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    examples = []
    for _ in range(rows):
        n = int(torch.randint(length // 2, length - 1, (), generator=g))
        ids = torch.randint(5, VOCAB.size, (n,), generator=g).numpy()
        import numpy as np
        examples.append({"input_ids": np.concatenate([[2], ids, [3]]),
                         "token_type_ids": np.zeros(n + 2, dtype=np.int64),
                         "word_starts": np.ones(n + 2, dtype=np.uint8)})
    return collate(examples, VOCAB)


def test_worked_example_losses():
    # True-token probabilities 0.60, 0.25, 0.05 give 0.5108, 1.3863, 2.9957, mean 1.631.
    probs = [0.60, 0.25, 0.05]
    vocab = 6
    hidden = torch.zeros(1, 3, vocab)
    for i, p in enumerate(probs):
        row = torch.full((vocab,), (1 - p) / (vocab - 1))
        row[i] = p
        hidden[0, i] = row.log()
    labels = torch.tensor([[0, 1, 2]])
    inputs = StepInputs(batch={"mlm_labels": labels},
                        encoder_output=EncoderOutput(hidden, hidden[:, 0]),
                        heads={"mlm": nn.Identity()}, encoder=None)
    objective = build_mlm()
    out = objective.loss(inputs)
    per_token = [-math.log(p) for p in probs]
    assert [round(x, 4) for x in per_token] == [0.5108, 1.3863, 2.9957]
    assert out.loss.item() == pytest.approx(1.631, abs=5e-4)
    assert out.metrics["accuracy"].item() == pytest.approx(2 / 3)  # the 0.05 token is not the argmax


def test_masking_statistics_over_100k_tokens():
    mask = build_mlm().batch_transform
    selected = masked = randomised = kept = candidates = 0
    special_hit = False
    for seed in range(20):
        batch = random_batch(seed=seed)
        out = mask(batch, torch.Generator().manual_seed(seed))
        sel = out["mlm_labels"] != -100
        cand = batch["attention_mask"].bool() & ~batch["special_tokens_mask"]
        special_hit |= bool((sel & ~cand).any())
        candidates += int(cand.sum())
        selected += int(sel.sum())
        masked += int((sel & (out["input_ids"] == VOCAB.mask_id)).sum())
        same = sel & (out["input_ids"] == batch["input_ids"])
        kept += int(same.sum())
        randomised += int((sel & (out["input_ids"] != VOCAB.mask_id) & ~same).sum())
        # labels hold the original tokens; random replacements are never special tokens
        assert torch.equal(out["mlm_labels"][sel], batch["input_ids"][sel])
        assert not torch.isin(out["input_ids"][sel & (out["input_ids"] != batch["input_ids"])
                                               & (out["input_ids"] != VOCAB.mask_id)],
                              torch.tensor([0, 1, 2, 3])).any()
    assert candidates > 100_000
    assert not special_hit
    assert selected / candidates == pytest.approx(0.15, abs=0.005)
    assert masked / selected == pytest.approx(0.80, abs=0.01)
    # a random draw can hit the original token (1 in 995): count those as random
    assert (randomised + kept) / selected == pytest.approx(0.20, abs=0.01)
    assert randomised / selected == pytest.approx(0.10 * 994 / 995, abs=0.01)


def test_each_row_predicts_its_exact_count_at_uniform_places_with_uniform_random_tokens():
    """k = round(0.15 n) of each row's n ordinary tokens, every place and every ordinary
    random token equally likely (all selected tokens randomised here, to count them)."""
    mask = build_mlm(mask_ratio=0.0, random_ratio=1.0).batch_transform
    early = chosen = 0
    drawn = torch.zeros(VOCAB.size)
    for seed in range(20):
        batch = random_batch(seed=seed)
        out = mask(batch, torch.Generator().manual_seed(seed))
        sel = out["mlm_labels"] != -100
        cand = batch["attention_mask"].bool() & ~batch["special_tokens_mask"]
        n = cand.sum(1)
        assert torch.equal(sel.sum(1), torch.round(n * 0.15).long().clamp(min=1))
        place = cand.long().cumsum(1) - 1  # rank of each ordinary token in its row
        early += int((sel & (place < (n[:, None] / 2))).sum())
        chosen += int(sel.sum())
        drawn += torch.bincount(out["input_ids"][sel], minlength=VOCAB.size)
    assert chosen > 15_000
    assert early / chosen == pytest.approx(0.5, abs=0.015)  # first half of the row as often as the second
    assert drawn[:5].sum() == 0  # never a special token
    expected = chosen / (VOCAB.size - 5)
    chi2 = float(((drawn[5:] - expected) ** 2 / expected).sum())
    dof = VOCAB.size - 6
    assert abs(chi2 - dof) < 5 * (2 * dof) ** 0.5  # uniform over the 995 ordinary ids


def test_every_row_gets_a_prediction():
    mask = build_mlm(mask_prob=0.01).batch_transform
    out = mask(random_batch(rows=16, length=16), torch.Generator().manual_seed(0))
    assert ((out["mlm_labels"] != -100).sum(1) >= 1).all()


@pytest.mark.parametrize("options, key", [
    ({"mask_prob": 0.0}, "objectives.mlm.mask_prob"),
    ({"mask_prob": 1.0}, "objectives.mlm.mask_prob"),
    ({"mask_ratio": 0.95, "random_ratio": 0.1}, "objectives.mlm.mask_ratio + objectives.mlm.random_ratio"),
])
def test_bad_masking_options(options, key):
    with pytest.raises(ConfigError, match=key.replace("+", r"\+")):
        check_objectives({"mlm": options}, Plugins())
