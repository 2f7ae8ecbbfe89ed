"""Whole-word masking: whole words, the budget, 80/10/10 per word, any tokenizer."""

import pytest
import torch
from tokenizers import Tokenizer, models, trainers

from objective_corpora import changes_only_at, collate_rows, context_for, mask_corpus, texts
from pretextual.core.documents import TokenizedDocuments
from pretextual.core.mix import check_objectives
from pretextual.core.tokenizer import SPECIAL_TOKENS, vocab_of
from pretextual.errors import ConfigError


@pytest.fixture(scope="module")
def masked(plugins, wordpiece_documents, wordpiece):
    spec = plugins.objective("wwm")
    objective = spec.build(spec.options(), context_for(wordpiece))
    return mask_corpus(objective.batch_transform, wordpiece_documents, vocab_of(wordpiece))


def spelled_word_start(tokenizer: Tokenizer, ids: torch.Tensor, test) -> torch.Tensor:
    """Word starts judged by spelling, independently of the word_starts the objective reads."""
    starts = torch.tensor([test(tokenizer.id_to_token(i)) for i in range(tokenizer.get_vocab_size())])
    return starts[ids]


def test_every_word_is_masked_whole(masked, wordpiece):
    assert masked.candidates.sum() >= 100_000
    selected = masked.selected
    # Against the batch's word groups: a continuation piece shares its word's fate.
    continuation = ~masked.word_starts[:, 1:] & masked.candidates[:, :-1]
    assert torch.equal(selected[:, 1:][continuation], selected[:, :-1][continuation])
    # Against WordPiece spelling: the selection switches only before a piece without "##",
    # or next to a special token or padding.
    boundary = spelled_word_start(wordpiece, masked.original, lambda t: not t.startswith("##"))
    boundary |= ~masked.candidates
    boundary[:, 1:] |= ~masked.candidates[:, :-1]
    assert changes_only_at(selected, boundary)
    multi_piece = (selected[:, 1:] & continuation).sum()
    assert multi_piece > 1000  # the test is not trivial: many chosen words have several pieces


def test_masked_share_is_the_budget(masked):
    share = masked.selected.sum() / masked.candidates.sum()
    assert abs(share.item() - 0.15) < 0.01


def test_special_tokens_and_padding_are_never_selected(masked):
    assert not (masked.selected & ~masked.candidates).any()
    assert torch.equal(masked.corrupted[~masked.candidates], masked.original[~masked.candidates])


def test_replacement_is_decided_per_word(masked, wordpiece):
    vocab = vocab_of(wordpiece)
    selected = masked.selected
    is_mask = masked.corrupted == vocab.mask_id
    continuation = ~masked.word_starts[:, 1:] & selected[:, 1:]
    assert torch.equal(is_mask[:, 1:][continuation], is_mask[:, :-1][continuation])
    first = selected & masked.word_starts
    words = first.sum().item()
    mask_share = (is_mask & first).sum().item() / words
    kept_share = ((masked.corrupted == masked.original) & first).sum().item() / words
    random_share = 1 - mask_share - kept_share
    assert words > 10_000
    assert abs(mask_share - 0.8) < 0.015
    assert abs(random_share - 0.1) < 0.015
    assert abs(kept_share - 0.1) < 0.015


@pytest.mark.parametrize("name, first_piece", [("bpe", lambda t: t.startswith("Ġ") or t == "."),
                                               ("unigram", lambda t: t.startswith("▁"))])
def test_words_are_whole_with_bpe_and_unigram(name, first_piece, plugins, documents, request):
    tokenizer = request.getfixturevalue(name)
    spec = plugins.objective("wwm")
    objective = spec.build(spec.options(), context_for(tokenizer))
    docs = TokenizedDocuments.from_documents(documents[:500], tokenizer)
    masked = mask_corpus(objective.batch_transform, docs, vocab_of(tokenizer))
    boundary = spelled_word_start(tokenizer, masked.original, first_piece)
    boundary |= ~masked.candidates
    boundary[:, 1:] |= ~masked.candidates[:, :-1]
    assert changes_only_at(masked.selected, boundary)
    assert (masked.selected[:, 1:] & ~boundary[:, 1:]).sum() > 300  # multi-piece words chosen
    share = masked.selected.sum() / masked.candidates.sum()
    assert abs(share.item() - 0.15) < 0.01


def test_every_row_with_an_ordinary_piece_gets_a_word(plugins, wordpiece):
    spec = plugins.objective("wwm")
    objective = spec.build(spec.options(), context_for(wordpiece))
    vocab = vocab_of(wordpiece)
    batch = collate_rows(["ban.", "ot ka", "lo mi ter", ""], wordpiece, vocab)
    out = objective.batch_transform(batch, torch.Generator().manual_seed(0))
    per_row = (out["mlm_labels"] != -100).sum(1).tolist()
    assert per_row[3] == 0  # [CLS] [SEP]: nothing to predict
    assert all(n >= 1 for n in per_row[:3])


def test_a_tokenizer_without_words_is_refused(plugins, documents):
    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))  # no pre-tokenizer: no word ids
    tokenizer.train_from_iterator(texts(documents[:50]), trainer=trainers.BpeTrainer(
        vocab_size=300, special_tokens=list(SPECIAL_TOKENS), show_progress=False))
    spec = plugins.objective("wwm")
    with pytest.raises(ConfigError, match=r"^objectives\.wwm: the tokenizer has no word information"):
        spec.build(spec.options(), context_for(tokenizer))


def test_bad_masking_options_name_the_key(plugins):
    with pytest.raises(ConfigError, match=r"objectives\.wwm\.mask_prob must be in \(0, 1\)"):
        check_objectives({"wwm": {"mask_prob": 1.5}}, plugins)
