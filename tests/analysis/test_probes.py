"""The held-out probes: built only from held-out documents, identical for every model, the
same plain 15% masking, pairs labelled by document, and a linear probe that finds a signal
where there is one and none where there is not."""

import math

import numpy as np
import pytest
import torch

from pretextual.analysis.ablate import _probe_inputs
from pretextual.analysis.probes import (ProbeData, ProbeError, _segments, mlm_probe,
                                        pair_probe_accuracy, run_probes)
from pretextual.core.documents import split_documents
from pretextual.core.prepare import tokenized_corpus
from pretextual.core.trainer import Trainer


@pytest.fixture
def trainer(tiny_config):
    return Trainer(tiny_config("roberta", "data.eval_fraction=0.2"), log=lambda *_: None)


def test_probes_see_only_the_held_out_documents(trainer):
    data = _probe_inputs(trainer)
    _, docs = tokenized_corpus(trainer.cfg.data, log=lambda *_: None)
    train, held_out = split_documents(docs, 0.2)
    assert list(data.documents) == list(held_out.documents) and len(data.documents) == 12
    assert not set(data.documents) & set(train.documents)
    # Every segment is a run of one held-out document's tokens, in order.
    per_doc = [_segments(held_out, d, (32 - 2) // 2) for d in range(len(held_out))]
    rows = [row[mask.bool()][1:-1] for batch in data.segments
            for row, mask in zip(batch["input_ids"], batch["attention_mask"])]
    assert [r.tolist() for r in rows] == [ids.tolist() for doc in per_doc for ids, _ in doc]


def test_pairs_are_distant_same_document_or_cross_document_within_a_fold(trainer):
    data = _probe_inputs(trainer)
    _, docs = tokenized_corpus(trainer.cfg.data, log=lambda *_: None)
    _, held_out = split_documents(docs, 0.2)
    where = [(d, i) for d in range(len(held_out)) for i in range(len(_segments(held_out, d, 15)))]
    assert data.labels.mean() == 0.5
    docs_of_fold = {}
    for (a, b), label, fold in zip(data.pairs, data.labels, data.folds):
        (doc_a, i), (doc_b, j) = where[a], where[b]
        if label == 1:
            assert doc_b == doc_a and j >= i + 2  # at least one segment between them
        else:
            assert doc_b != doc_a
        docs_of_fold.setdefault(fold, set()).update({doc_a, doc_b})
    # 12 documents make 5 folds, and no document (so no segment) is in two of them.
    assert len(docs_of_fold) == 5
    assert sum(map(len, docs_of_fold.values())) == len(set().union(*docs_of_fold.values())) == 12


def test_every_model_gets_the_same_inputs_masked_as_plain_mlm(trainer):
    first, second = _probe_inputs(trainer), _probe_inputs(trainer)
    for a, b in zip(first.mlm_batches, second.mlm_batches):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert np.array_equal(first.pairs, second.pairs)
    # 15% of each row's ordinary tokens, rounded, at least one (mlm's select_tokens).
    expected = sum(int(max(1, round(0.15 * int(n))))
                   for b in first.mlm_batches
                   for n in (b["attention_mask"].bool() & ~b["special_tokens_mask"]).sum(1))
    assert first.mlm_positions == expected


def test_mlm_probe_of_an_untrained_model_is_near_chance_and_absent_without_a_head(trainer):
    data = _probe_inputs(trainer)
    probes = run_probes(trainer.model, data, trainer.device)
    assert abs(probes["mlm_loss"] - math.log(300)) < 0.5 and probes["mlm_accuracy"] < 0.05
    assert trainer.model.training  # put back as it was
    del trainer.model.heads["mlm"]
    assert mlm_probe(trainer.model, data, trainer.device) == {"mlm_loss": None,
                                                              "mlm_accuracy": None}


def synthetic(n_docs: int = 20, per_doc: int = 6) -> ProbeData:
    """Pairs over n_docs * per_doc segments: document d is in fold d % 5, and its
    cross-document pairs go to the next document of that fold."""
    pairs, labels, folds = [], [], []
    for d in range(n_docs):
        other = (d + 5) % n_docs
        for i in range(per_doc - 2):
            a = d * per_doc + i
            pairs += [(a, a + 2), (a, other * per_doc + i)]
            labels += [1, 0]
            folds += [d % 5] * 2
    return ProbeData([], [], np.array(pairs), np.array(labels), np.array(folds), np.arange(n_docs))


def test_the_linear_probe_finds_a_document_signal_and_not_noise():
    data = synthetic()
    generator = torch.Generator().manual_seed(0)
    topics = torch.randn(20, 16, generator=generator).repeat_interleave(6, 0)
    with_topic = topics + 0.3 * torch.randn(120, 16, generator=generator)
    assert pair_probe_accuracy(with_topic, data) > 0.95
    noise = torch.randn(120, 16, generator=generator)
    assert 0.3 < pair_probe_accuracy(noise, data) < 0.7


def test_too_few_held_out_documents_is_one_clear_error(tiny_config):
    trainer = Trainer(tiny_config("roberta", "data.eval_fraction=0.05"), log=lambda *_: None)
    with pytest.raises(ProbeError, match=r"has 3 documents \(raise data.eval_fraction"):
        _probe_inputs(trainer)
