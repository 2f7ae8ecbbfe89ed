"""The masking shared by mlm, wwm and span: reproducible, dynamic, indifferent to the
layout and dtype of the batch, and the reusable pieces (select_tokens, replace_selected)."""

import numpy as np
import pytest
import torch

from objective_corpora import collate_rows, context_for, texts
from pretextual.core.tokenizer import vocab_of
from pretextual.objectives.masking import IGNORE_INDEX, replace_selected, select_tokens


@pytest.fixture(scope="module")
def batch(documents, wordpiece):
    return collate_rows(texts(documents[:40])[:64], wordpiece, vocab_of(wordpiece))


def transform(plugins, wordpiece, name):
    spec = plugins.objective(name)
    return spec.build(spec.options(), context_for(wordpiece)).batch_transform


@pytest.mark.parametrize("name", ["mlm", "wwm", "span"])
def test_masks_are_reproducible_and_dynamic(plugins, wordpiece, batch, name):
    mask = transform(plugins, wordpiece, name)
    a = mask(dict(batch), torch.Generator().manual_seed(1))
    b = mask(dict(batch), torch.Generator().manual_seed(1))
    c = mask(dict(batch), torch.Generator().manual_seed(2))
    assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["mlm_labels"], b["mlm_labels"])
    assert not torch.equal(a["mlm_labels"], c["mlm_labels"])
    assert int((a["mlm_labels"] != IGNORE_INDEX).sum()) > 50


@pytest.mark.parametrize("name", ["mlm", "wwm", "span"])
def test_masks_are_a_pure_function_of_the_generators_seed(plugins, wordpiece, batch, name):
    """Two generators with the same seed give identical batches, whatever the generator drew
    before it was seeded and whatever state torch's and NumPy's global generators are in."""
    mask = transform(plugins, wordpiece, name)
    torch.manual_seed(0)
    np.random.seed(0)
    a = mask(dict(batch), torch.Generator().manual_seed(11))
    used = torch.Generator()
    torch.rand(1000, generator=used)
    torch.manual_seed(1)
    np.random.seed(1)
    torch.rand(10), np.random.random(10)
    b = mask(dict(batch), used.manual_seed(11))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("name", ["mlm", "wwm", "span"])
def test_layout_and_dtype_do_not_change_the_masks(plugins, wordpiece, batch, name):
    """int32 ids and a non-contiguous view of the batch mask as the plain batch does, and
    the transform leaves its input as it was."""
    mask = transform(plugins, wordpiece, name)
    rows = {k: v[::2] for k, v in batch.items()}  # every other row: non-contiguous views
    before = {k: v.clone() for k, v in rows.items()}
    expected = mask({k: v.contiguous() for k, v in rows.items()}, torch.Generator().manual_seed(3))
    odd = dict(rows, input_ids=rows["input_ids"].int())
    got = mask(odd, torch.Generator().manual_seed(3))
    assert torch.equal(got["mlm_labels"], expected["mlm_labels"])
    assert torch.equal(got["input_ids"], expected["input_ids"])
    assert all(torch.equal(rows[k], before[k]) for k in rows)


def test_replace_selected_decides_once_per_group(wordpiece, batch):
    vocab = vocab_of(wordpiece)
    rows, length = batch["input_ids"].shape
    selected = select_tokens(batch, 0.5, torch.Generator().manual_seed(0))
    group = (torch.arange(length) // 4).expand(rows, length).contiguous()  # groups of 4 positions
    out = replace_selected(batch, selected, vocab, 0.5, 0.0, torch.Generator().manual_seed(0), group=group)
    masked = out["input_ids"] == vocab.mask_id
    assert torch.equal(out["mlm_labels"][selected], batch["input_ids"][selected])
    assert (out["mlm_labels"][~selected] == IGNORE_INDEX).all()
    assert torch.equal(out["input_ids"][~selected], batch["input_ids"][~selected])
    # within a group the selected positions are all [MASK] or all kept
    per_group = torch.zeros(rows, length // 4 + 1, 2, dtype=torch.long)
    per_group.index_put_((torch.arange(rows)[:, None].expand(rows, length)[selected], group[selected],
                          masked[selected].long()), torch.tensor(1), accumulate=True)
    mixed = (per_group[..., 0] > 0) & (per_group[..., 1] > 0)
    assert not mixed.any()
    share = masked[selected].float().mean().item()
    assert 0.35 < share < 0.65  # half the groups become [MASK]


def test_the_reusable_pieces_refuse_mismatched_inputs(wordpiece, batch):
    vocab = vocab_of(wordpiece)
    g = torch.Generator().manual_seed(0)
    selected = select_tokens(batch, 0.15, g)
    with pytest.raises(ValueError, match="selected has shape"):
        replace_selected(batch, selected[:, :-1], vocab, 0.8, 0.1, g)
    bad = torch.full_like(batch["input_ids"], batch["input_ids"].shape[1])
    with pytest.raises(ValueError, match=r"group values must be positions in \[0, "):
        replace_selected(batch, selected, vocab, 0.8, 0.1, g, group=bad)
    with pytest.raises(ValueError, match="special_tokens_mask has shape"):
        select_tokens(dict(batch, special_tokens_mask=batch["special_tokens_mask"][:-1]), 0.15, g)


def test_select_tokens_then_replace_selected_is_the_80_10_10_rule(wordpiece, batch):
    vocab = vocab_of(wordpiece)
    g = torch.Generator().manual_seed(5)
    masked = randomised = chosen = 0
    for _ in range(60):
        selected = select_tokens(batch, 0.15, g)
        out = replace_selected(batch, selected, vocab, 0.8, 0.1, g)
        new = out["input_ids"][selected]
        masked += int((new == vocab.mask_id).sum())
        randomised += int(((new != vocab.mask_id) & (new != batch["input_ids"][selected])).sum())
        chosen += int(selected.sum())
        assert not np.isin(new.numpy(), [i for i in vocab.special_ids if i != vocab.mask_id]).any()
    assert chosen > 8000
    assert masked / chosen == pytest.approx(0.8, abs=0.02)
    assert randomised / chosen == pytest.approx(0.1, abs=0.015)
