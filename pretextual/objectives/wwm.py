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

from pretextual.errors import ConfigError
from pretextual.objectives.mlm import (MLMHead, MLMOptions, on_cpu, check_masking_options,
                                       masked_lm_loss, replace_selected)
from pretextual.plugins.api import Batch, BuildContext, Objective, ObjectiveSpec
from pretextual.plugins.hookspecs import hookimpl


def word_index(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """The word of every position and which positions may be predicted.

    Returns ``(word, candidates)``: ``word`` [batch, seq] numbers the words of
    each row from 0 (special tokens and padding are words of their own and a
    word never continues past one); ``candidates`` marks the ordinary pieces.
    """
    candidates = batch["attention_mask"].bool() & ~batch["special_tokens_mask"].bool()
    starts = batch["word_starts"].bool() | ~candidates
    starts[:, 1:] |= ~candidates[:, :-1]
    return starts.long().cumsum(1) - 1, candidates


def select_words(batch: Batch, mask_prob: float, generator: torch.Generator
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Choose whole words covering about ``mask_prob`` of the ordinary pieces of each row.

    The words of a row are put in a random order and taken while the budget
    (``mask_prob`` x ordinary pieces) lasts: a word is taken when the midpoint
    of its pieces' running count falls below the budget, so a word that
    straddles the budget is taken as often as it is left, and the expected
    count matches the budget. A row with any ordinary piece gets at least one
    word. Memory is linear in the sequence length (no [seq, seq] comparison).

    Returns ``(selected, word)``: a boolean [batch, seq] mask and the word
    index of every position (for a per-word replacement decision).
    """
    if on_cpu(batch, "attention_mask", "special_tokens_mask", "word_starts"):
        return _select_words_numpy(batch, mask_prob, generator)
    word, candidates = word_index(batch)
    pieces = torch.zeros_like(word).scatter_add_(1, word, candidates.long())  # per word index
    score = torch.rand(word.shape, generator=generator).masked_fill_(pieces == 0, 2.0)
    order = score.argsort(dim=1)  # a random order of the words; empty word slots last
    pieces_in_order = pieces.gather(1, order)
    midpoint = pieces_in_order.cumsum(1) - pieces_in_order / 2
    budget = candidates.sum(1, keepdim=True) * mask_prob
    first_in_order = torch.arange(word.shape[1]) == 0
    take = ((midpoint < budget) | first_in_order) & (pieces_in_order > 0)
    chosen = torch.zeros_like(take).scatter_(1, order, take)  # back to word-index order
    return chosen.gather(1, word) & candidates, word


def _select_words_numpy(batch: Batch, mask_prob: float, generator: torch.Generator
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """select_words in NumPy, from the same draw (as mlm's masking does on the CPU: each
    torch op on a [batch, seq] tensor costs microseconds of dispatch)."""
    candidates = ((batch["attention_mask"].numpy() != 0)
                  & ~batch["special_tokens_mask"].numpy().astype(bool))
    starts = batch["word_starts"].numpy().astype(bool) | ~candidates
    starts[:, 1:] |= ~candidates[:, :-1]
    word = np.cumsum(starts, axis=1, dtype=np.int64) - 1
    rows, length = word.shape
    row = np.arange(rows)[:, None]
    pieces = np.bincount((word + length * row)[candidates], minlength=rows * length
                         ).reshape(rows, length)  # ordinary pieces per word index
    score = torch.rand(word.shape, generator=generator).numpy()
    score[pieces == 0] = 2.0
    order = np.argsort(score, axis=1)
    pieces_in_order = pieces[row, order]
    # float32, as torch computes them
    midpoint = (np.cumsum(pieces_in_order, axis=1).astype(np.float32)
                - pieces_in_order.astype(np.float32) / np.float32(2))
    budget = candidates.sum(1, keepdims=True).astype(np.float32) * np.float32(mask_prob)
    take = (midpoint < budget) & (pieces_in_order > 0)
    take[:, 0] = pieces_in_order[:, 0] > 0
    chosen = np.zeros_like(take)
    chosen[row, order] = take  # back to word-index order
    return torch.from_numpy(chosen[row, word] & candidates), torch.from_numpy(word)


def build(options: MLMOptions, context: BuildContext) -> Objective:
    check_masking_options("wwm", options)
    if not context.has_word_boundaries:
        raise ConfigError("objectives.wwm: the tokenizer has no word information (it has no "
                          "pre-tokenizer), so whole words cannot be found; use objectives.mlm or "
                          "a tokenizer with a pre-tokenizer")

    def mask(batch: Batch, generator: torch.Generator) -> Batch:
        selected, word = select_words(batch, options.mask_prob, generator)
        return replace_selected(batch, selected, context.vocab, options.mask_ratio,
                                options.random_ratio, generator, group=word)

    return Objective(loss=masked_lm_loss, heads={"mlm": MLMHead}, batch_transform=mask)


@hookimpl
def pretextual_register_objectives(register):
    register(ObjectiveSpec(name="wwm", build=build, options=MLMOptions,
                           description="Whole-word masking, 80/10/10 per word"))
