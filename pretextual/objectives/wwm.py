"""Whole-word masking (the whole-word-masking BERT models of Google's release).

Like masked language modelling, but chooses whole words instead of single
pieces: when a word is chosen, every one of its pieces is predicted, and the
80/10/10 decision ([MASK] / random token / unchanged) is made once per word.

Words come from the tokenizer's pre-tokenizer (the batch's ``word_starts``),
never from spelling such as a "##" prefix, so WordPiece, BPE and Unigram
vocabularies all work; a tokenizer without a pre-tokenizer has no words and is
refused when the objective is built.

The budget is a share of the pieces, not of the words: on average
``mask_prob`` of the ordinary pieces of each sequence are predicted, as with
``mlm``. The options, head (shared by name), replacement and loss are those of
``mlm``.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from pretextual.errors import ConfigError
from pretextual.objectives.mlm import (MLMHead, MLMOptions, as_numpy, check_masking_options,
                                       kernel_seed, masked_lm_loss, ordinary_ids, replace_loop,
                                       with_labels)
from pretextual.plugins.api import Batch, BuildContext, Objective, ObjectiveSpec, Vocab
from pretextual.plugins.hookspecs import hookimpl


def select_words(batch: Batch, mask_prob: float, generator: torch.Generator
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Choose whole words covering about ``mask_prob`` of the ordinary pieces of each row.

    The words of a row are put in a random order and taken while the budget
    (``mask_prob`` x ordinary pieces) lasts: a word is taken when the midpoint
    of its pieces' running count falls below the budget, so a word that
    straddles the budget is taken as often as it is left, and the expected
    count matches the budget. A row with any ordinary piece gets at least one
    word. Words are found by :func:`find_words`.

    Returns ``(selected, word)``: a boolean [batch, seq] mask and, at the
    selected positions, the position where their word starts (for a per-word
    replacement decision).
    """
    attention = batch["attention_mask"]
    selected, word = _select_kernel(kernel_seed(generator), as_numpy(attention),
                                    as_numpy(batch["special_tokens_mask"]),
                                    as_numpy(batch["word_starts"]), mask_prob)
    return torch.from_numpy(selected).to(attention.device), torch.from_numpy(word).to(attention.device)


def mask_words(batch: Batch, vocab: Vocab, options: MLMOptions, generator: torch.Generator) -> Batch:
    """select_words then mlm's replacement per word, in one compiled call."""
    corrupted, labels = _mask_kernel(
        kernel_seed(generator), as_numpy(batch["input_ids"]), as_numpy(batch["attention_mask"]),
        as_numpy(batch["special_tokens_mask"]), as_numpy(batch["word_starts"]),
        ordinary_ids(vocab), vocab.mask_id, options.mask_prob, options.mask_ratio,
        options.random_ratio)
    return with_labels(batch, corrupted, labels)


@njit(cache=True, nogil=True)
def find_words(attention, special, word_starts, r, first, pieces, stretch):
    """The words of row ``r`` that hold ordinary pieces, in order: the first position and
    the number of pieces of each, and the stretch between special tokens it lies in, written
    to ``first``, ``pieces`` and ``stretch``. A word is a word start and the ordinary pieces
    after it: a special token or padding ends it. Returns (words, ordinary pieces)."""
    n_words, total, previous, between = 0, 0, False, 0
    for j in range(attention.shape[1]):
        candidate = attention[r, j] != 0 and not special[r, j]
        if not candidate:
            between += 1
        else:
            if word_starts[r, j] or not previous:
                first[n_words], pieces[n_words], stretch[n_words] = j, 0, between
                n_words += 1
            pieces[n_words - 1] += 1
            total += 1
        previous = candidate
    return n_words, total


@njit(cache=True, nogil=True)
def _choose_words(attention, special, word_starts, mask_prob):
    rows, length = attention.shape
    selected = np.zeros((rows, length), np.bool_)
    word = np.zeros((rows, length), np.int64)
    first, pieces = np.empty(length, np.int64), np.empty(length, np.int64)
    stretch, order = np.empty(length, np.int64), np.empty(length, np.int64)
    for r in range(rows):
        n_words, total = find_words(attention, special, word_starts, r, first, pieces, stretch)
        budget = np.float32(total) * np.float32(mask_prob)
        covered = 0
        order[:n_words] = np.arange(n_words)
        for i in range(n_words):  # the words in a random order (Fisher-Yates), while the budget lasts
            t = np.random.randint(i, n_words)
            order[i], order[t] = order[t], order[i]
            k = order[i]
            if i > 0 and covered + pieces[k] / 2 >= budget:
                break
            covered += pieces[k]
            selected[r, first[k]:first[k] + pieces[k]] = True
            word[r, first[k]:first[k] + pieces[k]] = first[k]
    return selected, word


@njit(cache=True, nogil=True)
def _select_kernel(seed, attention, special, word_starts, mask_prob):
    np.random.seed(seed)
    return _choose_words(attention, special, word_starts, mask_prob)


@njit(cache=True, nogil=True)
def _mask_kernel(seed, ids, attention, special, word_starts, ordinary, mask_id, mask_prob,
                 mask_ratio, random_ratio):
    np.random.seed(seed)
    selected, word = _choose_words(attention, special, word_starts, mask_prob)
    return replace_loop(ids, selected, word, ordinary, mask_id, mask_ratio, random_ratio)


def build(options: MLMOptions, context: BuildContext) -> Objective:
    check_masking_options("wwm", options)
    if not context.has_word_boundaries:
        raise ConfigError("objectives.wwm: the tokenizer has no word information (it has no "
                          "pre-tokenizer), so whole words cannot be found; use objectives.mlm or "
                          "a tokenizer with a pre-tokenizer")

    def mask(batch: Batch, generator: torch.Generator) -> Batch:
        return mask_words(batch, context.vocab, options, generator)

    return Objective(loss=masked_lm_loss, heads={"mlm": MLMHead}, batch_transform=mask)


@hookimpl
def pretextual_register_objectives(register):
    register(ObjectiveSpec(name="wwm", build=build, options=MLMOptions,
                           description="Whole-word masking, 80/10/10 per word"))
