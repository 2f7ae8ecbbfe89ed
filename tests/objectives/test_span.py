"""Span masking: span lengths, whole words, the budget, options."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from objective_corpora import changes_only_at, collate_rows, context_for, mask_corpus
from pretextual.core.documents import TokenizedDocuments
from pretextual.core.mix import check_objectives
from pretextual.core.tokenizer import vocab_of
from pretextual.errors import ConfigError
from pretextual.objectives.masking import span_lengths, span_starts
from pretextual.objectives.span import span_length_cdf


def sample_span_lengths(n: int, cdf: np.ndarray, seed: int) -> torch.Tensor:
    """``n`` lengths drawn by masking.span_lengths, the draw of mask_spans (int64, shape [n])."""
    return span_lengths(cdf, (n,), torch.Generator().manual_seed(seed))


def truncated_geometric(p: float, max_span: int) -> list[float]:
    """P(length = k) for k = 1..max_span: Geo(p) renormalised over [1, max_span]."""
    weights = [p * (1 - p) ** (k - 1) for k in range(1, max_span + 1)]
    return [w / sum(weights) for w in weights]


@pytest.mark.parametrize("p, max_span", [(0.2, 10), (0.5, 3), (0.05, 20)])
def test_span_lengths_follow_the_truncated_geometric(p, max_span):
    cdf = span_length_cdf(p, max_span)
    lengths = sample_span_lengths(200_000, cdf, seed=0)
    probs = truncated_geometric(p, max_span)
    mean = sum(k * q for k, q in zip(range(1, max_span + 1), probs))
    assert lengths.min() >= 1 and lengths.max() <= max_span
    assert abs(lengths.double().mean().item() - mean) < 0.05 * mean
    counts = torch.bincount(lengths, minlength=max_span + 1)[1:] / len(lengths)
    assert torch.allclose(counts, torch.tensor(probs, dtype=counts.dtype), atol=0.005)


def test_spanbert_defaults_give_the_papers_mean_length():
    cdf = span_length_cdf(0.2, 10)
    lengths = sample_span_lengths(200_000, cdf, seed=1)
    assert abs(lengths.double().mean().item() - 3.8) < 0.05  # SpanBERT reports a mean of 3.8 words


def test_p_of_one_gives_single_words():
    lengths = sample_span_lengths(1000, span_length_cdf(1.0, 10), seed=0)
    assert torch.equal(lengths, torch.ones(1000, dtype=lengths.dtype))


def turn_by_turn(key, lengths, opens_stretch):
    """span_starts written as the process it computes: each word in the order of its key
    starts a span unless already hidden, and the span hides words to the right until its
    length, a hidden word or a word that opens a stretch."""
    rows, words = key.shape
    start = torch.full((rows, words), -1)
    for r in range(rows):
        for s in sorted(range(words), key=lambda w: key[r, w].item()):
            if start[r, s] >= 0:
                continue  # already hidden: its turn starts nothing
            for w in range(s, min(s + int(lengths[r, s]), words)):
                if start[r, w] >= 0 or (w > s and opens_stretch[r, w]):
                    break
                start[r, w] = s
    return start


def test_span_starts_is_the_turn_by_turn_process():
    g = torch.Generator().manual_seed(0)
    for words, longest in [(1, 3), (7, 1), (13, 2), (40, 5), (64, 10)]:
        key = torch.rand(8, words, generator=g, dtype=torch.float64)
        lengths = torch.randint(1, longest + 1, (8, words), generator=g)
        opens = torch.rand(8, words, generator=g) < 0.15
        opens[:, 0] = True
        assert torch.equal(span_starts(key, lengths, opens, longest), turn_by_turn(key, lengths, opens))


@pytest.fixture(scope="module")
def masked(plugins, wordpiece_documents, wordpiece):
    spec = plugins.objective("span")
    objective = spec.build(spec.options(), context_for(wordpiece))
    return mask_corpus(objective.batch_transform, wordpiece_documents, vocab_of(wordpiece))


def test_spans_are_whole_words(masked, wordpiece):
    vocab = vocab_of(wordpiece)
    continuation = torch.tensor([wordpiece.id_to_token(i).startswith("##")
                                 for i in range(vocab.size)])[masked.original]
    boundary = ~continuation | ~masked.candidates
    boundary[:, 1:] |= ~masked.candidates[:, :-1]
    assert changes_only_at(masked.selected, boundary)
    assert not (masked.selected & ~masked.candidates).any()


def test_spans_cover_several_words(masked):
    selected = masked.selected
    run_starts = selected.clone()
    run_starts[:, 1:] &= ~selected[:, :-1]
    words_per_run = (selected & masked.word_starts).sum() / run_starts.sum()
    # Spans average 3.8 words; stops at sentence ends and at the budget shorten
    # them, touching spans merge. Whole-word masking gives about 1.2 here.
    assert 2.8 < words_per_run.item() < 4.0


def test_masked_share_is_the_budget(masked):
    assert masked.candidates.sum() >= 100_000
    share = masked.selected.sum() / masked.candidates.sum()
    assert abs(share.item() - 0.15) < 0.01


def test_replacement_is_decided_per_span(plugins, documents, wordpiece):
    spec = plugins.objective("span")
    objective = spec.build(spec.options(mask_ratio=0.5, random_ratio=0.0), context_for(wordpiece))
    docs = TokenizedDocuments.from_documents(documents[:800], wordpiece)
    masked = mask_corpus(objective.batch_transform, docs, vocab_of(wordpiece))
    selected = masked.selected
    is_mask = masked.corrupted == vocab_of(wordpiece).mask_id
    # Along a run of selected pieces, [MASK] switches on or off only where one span
    # meets another; with a per-piece decision it would switch at half the pieces.
    inside = selected[:, 1:] & selected[:, :-1]
    switches = (is_mask[:, 1:] != is_mask[:, :-1]) & inside
    run_starts = selected.clone()
    run_starts[:, 1:] &= ~selected[:, :-1]
    assert switches.sum() < 0.25 * run_starts.sum()
    assert abs(is_mask.sum() / selected.sum() - 0.5) < 0.04


def test_every_row_with_an_ordinary_piece_gets_a_span(plugins, wordpiece):
    spec = plugins.objective("span")
    objective = spec.build(spec.options(), context_for(wordpiece))
    batch = collate_rows(["ban.", "ot ka", "lo mi ter", ""], wordpiece, vocab_of(wordpiece))
    out = objective.batch_transform(batch, torch.Generator().manual_seed(0))
    per_row = (out["mlm_labels"] != -100).sum(1).tolist()
    assert per_row[3] == 0  # [CLS] [SEP]: nothing to predict
    assert all(n >= 1 for n in per_row[:3])


@pytest.mark.parametrize("options, message", [
    ({"p": 1.5}, r"objectives\.span\.p must be in \(0, 1\], got 1\.5"),
    ({"p": 0.0}, r"objectives\.span\.p must be in \(0, 1\], got 0\.0"),
    ({"max_span": 0}, r"objectives\.span\.max_span must be at least 1, got 0"),
    ({"mask_prob": 0.0}, r"objectives\.span\.mask_prob must be in \(0, 1\)"),
])
def test_bad_options_name_the_key(plugins, options, message):
    with pytest.raises(ConfigError, match=message):
        check_objectives({"span": options}, plugins)


def test_a_tokenizer_without_words_is_refused(plugins, wordpiece):
    spec = plugins.objective("span")
    context = replace(context_for(wordpiece), has_word_boundaries=False)
    with pytest.raises(ConfigError, match=r"^objectives\.span: the tokenizer has no word information"):
        spec.build(spec.options(), context)
