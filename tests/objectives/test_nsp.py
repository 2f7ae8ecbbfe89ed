"""Next-sentence prediction: the pairs, their labels, the head and the loss."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from objective_corpora import context_for, generated_documents, segments, synthetic_corpus
from pretextual.core.corpus import Document
from pretextual.core.data import collate
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
    return synthetic_corpus(1000, seed=0)


def build_nsp(plugins, context, **options):
    spec = plugins.objective("nsp")
    return spec.build(spec.options(**options), context)


@pytest.fixture(scope="module")
def pairs(plugins, corpus):
    """At least 10,000 pairs: examples of several epochs (each its own generator)."""
    builder = build_nsp(plugins, corpus.context(MAX_SEQ_LENGTH)).example_builder
    examples = []
    for epoch in range(5):
        examples += builder(corpus.docs, np.random.default_rng(epoch))
        if len(examples) >= 10_000:
            return examples
    raise AssertionError(f"only {len(examples)} pairs")


def test_labels_are_balanced(pairs):
    labels = np.array([e["next_sentence_label"] for e in pairs])
    assert len(labels) >= 10_000
    assert set(labels.tolist()) == {0, 1}
    assert abs(labels.mean() - 0.5) < 0.02


def test_random_next_segments_come_from_another_document(pairs, corpus):
    random_pairs = 0
    for example in pairs:
        a, b = segments(example)
        doc_a, doc_b = set(corpus.doc_of[a]), set(corpus.doc_of[b])
        assert len(doc_a) == 1 and len(doc_b) == 1  # a segment never mixes documents
        if example["next_sentence_label"] == 1:
            random_pairs += 1
            assert doc_a != doc_b
        else:
            assert doc_a == doc_b
    assert random_pairs > 4_000


def test_true_next_pairs_are_the_text_that_follows(pairs, corpus):
    untruncated = 0
    for example in pairs:
        a, b = segments(example)
        assert np.all(np.diff(a) == 1) and np.all(np.diff(b) == 1)  # contiguous text
        if example["next_sentence_label"] != 0:
            continue
        assert b[0] > a[-1]
        if len(a) + len(b) < MAX_NUM_TOKENS:  # nothing was trimmed
            untruncated += 1
            assert b[0] == a[-1] + 1
            assert corpus.sentence_start[a[0]] and corpus.sentence_end[a[-1]]
    assert untruncated > 1_000


def test_examples_fit_with_segment_ids(pairs, corpus):
    vocab = corpus.vocab
    for example in pairs:
        a, b = segments(example)
        ids, types = example["input_ids"], example["token_type_ids"]
        assert len(ids) <= MAX_SEQ_LENGTH
        assert len(a) >= 1 and len(b) >= 1
        assert ids[0] == vocab.cls_id and ids[len(a) + 1] == vocab.sep_id and ids[-1] == vocab.sep_id
        assert np.array_equal(types, [0] * (len(a) + 2) + [1] * (len(b) + 1))
        assert example["word_starts"][1] == 1 and example["word_starts"][len(a) + 2] == 1


def test_short_sequences_are_drawn_with_short_seq_prob(plugins, corpus):
    def mean_length(short_seq_prob):
        builder = build_nsp(plugins, corpus.context(MAX_SEQ_LENGTH),
                            short_seq_prob=short_seq_prob).example_builder
        return np.mean([len(e["input_ids"]) for e in builder(corpus.docs, np.random.default_rng(0))])

    full, short = mean_length(0.0), mean_length(1.0)
    assert full > 0.9 * MAX_SEQ_LENGTH  # chunks fill the sequence, then get trimmed
    assert short < 0.75 * MAX_SEQ_LENGTH  # targets uniform in [2, 61]


def test_worked_example_loss(plugins, wordpiece):
    # A true pair given P(follows) = 0.9 costs -ln 0.9 = 0.1054; a random pair given
    # P(follows) = 0.2 costs -ln 0.8 = 0.2231; mean 0.1643.
    nsp = build_nsp(plugins, context_for(wordpiece))
    identity = nn.Linear(2, 2)
    with torch.no_grad():
        identity.weight.copy_(torch.eye(2))
        identity.bias.zero_()
    log_probs = torch.tensor([[0.9, 0.1], [0.2, 0.8]]).log()  # [P(follows), P(random)]
    out = nsp.loss(StepInputs(batch={"next_sentence_label": torch.tensor([0, 1])},
                              encoder_output=EncoderOutput(torch.zeros(2, 4, 2), log_probs),
                              heads={"nsp": identity}, encoder=None))
    assert out.loss.item() == pytest.approx(0.1643, abs=1e-4)
    assert out.metrics["accuracy"].item() == 1.0

    # With the MLM worked example (true-token probabilities 0.60, 0.25, 0.05: mean 1.631),
    # BERT's pre-training loss is 1.7952.
    spec = plugins.objective("mlm")
    mlm = spec.build(spec.options(), context_for(wordpiece))
    hidden = torch.zeros(1, 3, 3)
    for i, p in enumerate([0.60, 0.25, 0.05]):
        row = torch.full((3,), (1 - p) / 2)
        row[i] = p
        hidden[0, i] = row.log()
    mlm_out = mlm.loss(StepInputs(batch={"mlm_labels": torch.tensor([[0, 1, 2]])},
                                  encoder_output=EncoderOutput(hidden, hidden[:, 0]),
                                  heads={"mlm": nn.Identity()}, encoder=None))
    assert mlm_out.loss.item() == pytest.approx(1.631, abs=1e-3)
    assert (mlm_out.loss + out.loss).item() == pytest.approx(1.7952, abs=1e-4)


def test_head_is_a_single_linear_layer(plugins, wordpiece):
    context = context_for(wordpiece)
    encoder = BertModel(context.encoder_config)
    head = build_nsp(plugins, context).heads["nsp"](encoder)
    state = head.state_dict()
    assert set(state) == {"weight", "bias"}  # Hugging Face's cls.seq_relationship
    assert state["weight"].shape == (2, context.encoder_config.hidden_size)
    assert torch.equal(state["bias"], torch.zeros(2))
    assert abs(state["weight"].std().item() - context.encoder_config.initializer_range) < 0.01


def test_an_untrained_model_is_at_chance(plugins, documents, wordpiece):
    torch.manual_seed(0)
    context = context_for(wordpiece)
    nsp = build_nsp(plugins, context)
    docs = TokenizedDocuments.from_documents(documents[:100], wordpiece)
    examples = nsp.example_builder(docs, np.random.default_rng(0))[:64]
    batch = collate(examples, context.vocab)
    assert batch["next_sentence_label"].shape == (64,)
    encoder = BertModel(context.encoder_config).eval()
    out = nsp.loss(StepInputs(batch=batch, heads={"nsp": nsp.heads["nsp"](encoder)}, encoder=encoder,
                              encoder_output=encoder(batch["input_ids"], batch["attention_mask"],
                                                     batch["token_type_ids"])))
    assert out.loss.item() == pytest.approx(math.log(2), abs=0.01)


def test_one_document_is_refused(plugins, wordpiece):
    docs = TokenizedDocuments.from_documents(generated_documents(1, 1, sentences=(5, 5)), wordpiece)
    builder = build_nsp(plugins, context_for(wordpiece)).example_builder
    with pytest.raises(DataError, match=r"^objectives\.nsp needs at least two documents"):
        builder(docs, np.random.default_rng(0))


def test_single_sentence_documents_are_refused(plugins, wordpiece):
    docs = TokenizedDocuments.from_documents(generated_documents(1, 20, sentences=(1, 1)), wordpiece)
    builder = build_nsp(plugins, context_for(wordpiece)).example_builder
    with pytest.raises(DataError, match=r"^objectives\.nsp needs documents of at least two sentences"):
        builder(docs, np.random.default_rng(0))


def test_single_sentence_documents_still_serve_as_random_next_segments(plugins, wordpiece):
    docs = [Document(["ban ka lo.", "mi ter ot."], "two"), Document(["sul pra ve."], "one")]
    tokenized = TokenizedDocuments.from_documents(docs, wordpiece)
    builder = build_nsp(plugins, context_for(wordpiece), random_next_prob=1.0).example_builder
    (example,) = builder(tokenized, np.random.default_rng(0))
    a, b = segments(example)
    assert wordpiece.decode(a.tolist()) == "ban ka lo."
    assert wordpiece.decode(b.tolist()) == "sul pra ve."
    assert example["next_sentence_label"] == 1


@pytest.mark.parametrize("key, value", [("random_next_prob", 1.5), ("short_seq_prob", -0.1)])
def test_bad_probability_names_the_key(plugins, key, value):
    with pytest.raises(ConfigError, match=rf"objectives\.nsp\.{key} must be in \[0, 1\], got {value}"):
        check_objectives({"nsp": {key: value}}, plugins)
