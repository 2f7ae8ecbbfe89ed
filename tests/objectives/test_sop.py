"""Sentence-order prediction: consecutive segments of one document, swapped half the time."""

import numpy as np
import pytest
import torch

from objective_corpora import context_for, generated_documents, segments, synthetic_corpus
from pretextual.core.documents import TokenizedDocuments
from pretextual.architectures.bert import BertModel
from pretextual.architectures.common import EncoderOutput
from pretextual.core.mix import check_objectives
from pretextual.errors import ConfigError, DataError
from pretextual.plugins.api import StepInputs

MAX_SEQ_LENGTH = 64
MAX_NUM_TOKENS = MAX_SEQ_LENGTH - 3


@pytest.fixture(scope="module")
def corpus():
    return synthetic_corpus(1000, seed=1)


def build_sop(plugins, context, **options):
    spec = plugins.objective("sop")
    return spec.build(spec.options(**options), context)


@pytest.fixture(scope="module")
def pairs(plugins, corpus):
    """At least 10,000 pairs: examples of several epochs (each its own generator)."""
    builder = build_sop(plugins, corpus.context(MAX_SEQ_LENGTH)).example_builder
    examples = []
    for epoch in range(8):
        examples += builder(corpus.docs, np.random.default_rng(epoch))
        if len(examples) >= 10_000:
            return examples
    raise AssertionError(f"only {len(examples)} pairs")


def test_half_the_pairs_are_swapped(pairs):
    labels = np.array([e["sentence_order_label"] for e in pairs])
    assert len(labels) >= 10_000
    assert abs(labels.mean() - 0.5) < 0.02


def test_pairs_never_mix_documents_and_keep_or_swap_the_order(pairs, corpus):
    untruncated = 0
    for example in pairs:
        a, b = segments(example)
        assert len(example["input_ids"]) <= MAX_SEQ_LENGTH
        assert len(set(corpus.doc_of[np.concatenate([a, b])])) == 1
        assert np.all(np.diff(a) == 1) and np.all(np.diff(b) == 1)  # contiguous text
        first, second = (a, b) if example["sentence_order_label"] == 0 else (b, a)
        assert second[0] > first[-1]
        if len(a) + len(b) < MAX_NUM_TOKENS:  # nothing was trimmed: the two are adjacent
            untruncated += 1
            assert second[0] == first[-1] + 1
            assert corpus.sentence_start[second[0]] and corpus.sentence_end[first[-1]]
    assert untruncated > 1_000


def test_a_swapped_pair_is_the_unswapped_pair_reversed(plugins, corpus):
    context = corpus.context(MAX_SEQ_LENGTH)
    kept, swapped = (build_sop(plugins, context, swap_prob=p).example_builder(
        corpus.docs, np.random.default_rng(3)) for p in (0.0, 1.0))
    assert len(kept) == len(swapped) > 1000
    for k, s in zip(kept, swapped):
        (ka, kb), (sa, sb) = segments(k), segments(s)
        assert np.array_equal(sa, kb) and np.array_equal(sb, ka)
        assert k["sentence_order_label"] == 0 and s["sentence_order_label"] == 1


def test_one_long_document_is_enough(plugins, wordpiece):
    docs = TokenizedDocuments.from_documents(generated_documents(2, 1, sentences=(40, 40)), wordpiece)
    examples = build_sop(plugins, context_for(wordpiece)).example_builder(docs, np.random.default_rng(0))
    assert len(examples) >= 5


def test_single_sentence_documents_are_refused(plugins, wordpiece):
    docs = TokenizedDocuments.from_documents(generated_documents(1, 20, sentences=(1, 1)), wordpiece)
    builder = build_sop(plugins, context_for(wordpiece)).example_builder
    with pytest.raises(DataError, match=r"^objectives\.sop needs documents of at least two sentences"):
        builder(docs, np.random.default_rng(0))


def test_loss_reads_its_own_head_and_label(plugins, wordpiece):
    context = context_for(wordpiece)
    sop = build_sop(plugins, context)
    head = sop.heads["sop"](BertModel(context.encoder_config))
    assert set(head.state_dict()) == {"weight", "bias"}  # ALBERT's sop_classifier.classifier
    with torch.no_grad():
        head.weight.copy_(torch.eye(2, context.encoder_config.hidden_size))
        head.bias.zero_()
    pooled = torch.zeros(2, context.encoder_config.hidden_size)
    pooled[:, :2] = torch.tensor([[0.7, 0.3], [0.4, 0.6]]).log()  # [P(in order), P(swapped)]
    out = sop.loss(StepInputs(batch={"sentence_order_label": torch.tensor([0, 1])},
                              encoder_output=EncoderOutput(torch.zeros(2, 4, 32), pooled),
                              heads={"sop": head}, encoder=None))
    assert out.loss.item() == pytest.approx((-np.log(0.7) - np.log(0.6)) / 2, abs=1e-5)
    assert out.metrics["accuracy"].item() == 1.0


@pytest.mark.parametrize("key, value", [("swap_prob", -0.1), ("short_seq_prob", 1.5)])
def test_bad_probability_names_the_key(plugins, key, value):
    with pytest.raises(ConfigError, match=rf"objectives\.sop\.{key} must be in \[0, 1\], got {value}"):
        check_objectives({"sop": {key: value}}, plugins)
