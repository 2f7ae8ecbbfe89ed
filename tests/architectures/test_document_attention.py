"""data.document_attention: in a packed example each token attends only within its own
document, and positions restart at each, in either architecture."""

from __future__ import annotations

import pytest
import torch

from pretextual.architectures import architecture, sized_config
from pretextual.architectures.common import document_positions
from pretextual.core.trainer import Trainer

DOCUMENTS = torch.tensor([[1] * 9 + [2] * 12 + [3] * 7 + [0] * 4,  # three documents, then padding
                          [1] * 20 + [2] * 12])


def encoder(name: str):
    spec = architecture(name)
    config = sized_config(spec, "tiny", {}, {}, vocab_size=200, pad_token_id=0,
                          max_position_embeddings=64)
    torch.manual_seed(0)
    return spec.model(config).eval()


def packed_ids() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(5, 200, DOCUMENTS.shape, generator=torch.Generator().manual_seed(0))
    mask = (DOCUMENTS > 0).long()
    return ids.masked_fill(mask == 0, 0), mask


def test_positions_restart_at_each_document():
    assert document_positions(DOCUMENTS)[0].tolist() == [*range(9), *range(12), *range(7), *range(4)]
    assert document_positions(DOCUMENTS)[1].tolist() == [*range(20), *range(12)]


@pytest.mark.parametrize("name", ["bert", "modernbert"])
def test_changing_one_document_leaves_the_others_bit_identical(name):
    model = encoder(name)
    ids, mask = packed_ids()
    changed = ids.clone()
    changed[0, 9:21] = torch.randint(5, 200, (12,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(ids, mask, document_ids=DOCUMENTS).last_hidden_state
        after = model(changed, mask, document_ids=DOCUMENTS).last_hidden_state
        full_before = model(ids, mask).last_hidden_state
        full_after = model(changed, mask).last_hidden_state
    others = torch.cat([torch.arange(9), torch.arange(21, 28)])
    assert torch.equal(before[0, others], after[0, others])
    assert torch.equal(before[1], after[1])
    assert not torch.equal(before[0, 9:21], after[0, 9:21])
    # under full attention the change reaches every document
    assert (full_before[0, others] - full_after[0, others]).abs().max() > 1e-4


@pytest.mark.parametrize("name", ["bert", "modernbert"])
def test_a_packed_document_is_encoded_as_if_alone(name):
    model = encoder(name)
    ids, mask = packed_ids()
    with torch.no_grad():
        packed = model(ids, mask, document_ids=DOCUMENTS).last_hidden_state[0, 21:28]
        alone = model(ids[:1, 21:28], mask[:1, 21:28]).last_hidden_state[0]
    assert (packed - alone).abs().max() < 1e-5


def test_packed_examples_carry_their_documents(tiny_config):
    cfg = tiny_config("roberta", "model.architecture=modernbert", "data.max_seq_length=64")
    trainer = Trainer(cfg, log=lambda *a: None)
    assert cfg.data.document_attention is True  # modernbert's default, as config.yaml records it
    batch = trainer.train_batches[0]
    docs, ids, mask = batch["document_ids"], batch["input_ids"], batch["attention_mask"].bool()
    assert torch.equal(docs > 0, mask)  # padding is document 0
    sep = trainer.vocab.sep_id
    for row in range(len(ids)):
        d, t = docs[row][mask[row]], ids[row][mask[row]]
        assert d[0] == 1 and bool((d[1:] - d[:-1] >= 0).all()) and bool((d[1:] - d[:-1] <= 1).all())
        ends = (d[1:] != d[:-1]).nonzero().squeeze(1)
        assert bool((t[ends] == sep).all())  # each document ends with the [SEP] that separates it
    assert int(docs.max()) > 1  # the embedded packing does cross documents


def test_bert_packs_under_full_attention_unless_asked(tiny_config):
    trainer = Trainer(tiny_config("roberta"), log=lambda *a: None)
    assert trainer.cfg.data.document_attention is False and "document_ids" not in trainer.train_batches[0]
    trainer = Trainer(tiny_config("roberta", "data.document_attention=true", "data.max_seq_length=64"),
                      log=lambda *a: None)
    assert "document_ids" in trainer.train_batches[0]
    trainer.train()  # bert reads them
