"""Span masking (SpanBERT, Joshi et al. 2020, section 3.1).

Hides contiguous spans of whole words instead of scattered pieces. Repeatedly:
draw a span length in words from a geometric distribution Geo(p) truncated to
[1, max_span], pick a random word not yet hidden as its start, and hide that
many whole words from there, until about ``mask_prob`` of the ordinary pieces
of the sequence are hidden. The 80/10/10 decision ([MASK] / random token /
unchanged) is made once per span.

Truncation, as in SpanBERT's released code (``len_distrib`` renormalised over
1..10): a length above max_span is never drawn, rather than clipped to
max_span, so no mass piles up at max_span. At p = 0.2 and max_span = 10 the
mean is 3.8 words, the figure the paper reports (clipping would give 4.46).

A span stops early at a special token (so it never crosses [SEP]), at a word
already hidden, or at the end of the sequence. The head (shared by name),
replacement and loss are those of ``mlm``; SpanBERT's span-boundary objective
is not part of this objective.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from numba import njit

from pretextual.errors import ConfigError
from pretextual.objectives.mlm import (MLMHead, as_numpy, check_masking_options, kernel_seed,
                                       masked_lm_loss, ordinary_ids, replace_loop, with_labels)
from pretextual.objectives.wwm import find_words
from pretextual.plugins.api import Batch, BuildContext, Objective, ObjectiveSpec
from pretextual.plugins.hookspecs import hookimpl


@dataclass
class SpanOptions:
    p: float = 0.2
    """Parameter of the geometric distribution of span lengths in words (shorter spans are likelier)."""
    max_span: int = 10
    """Longest span in words; the geometric distribution is truncated there (mean 3.8 at p=0.2)."""
    mask_prob: float = 0.15
    """Share of the ordinary (non-special, non-padding) pieces of each sequence to predict."""
    mask_ratio: float = 0.8
    """Share of the spans replaced by [MASK]."""
    random_ratio: float = 0.1
    """Share of the spans replaced by random ordinary tokens (the rest stay)."""


def check_span_options(options: SpanOptions) -> None:
    """Raise ConfigError naming the key for an impossible span configuration."""
    if not 0.0 < options.p <= 1.0:
        raise ConfigError(f"objectives.span.p must be in (0, 1], got {options.p}")
    if options.max_span < 1:
        raise ConfigError(f"objectives.span.max_span must be at least 1, got {options.max_span}")
    check_masking_options("span", options)


def span_length_cdf(p: float, max_span: int) -> np.ndarray:
    """The cumulative distribution of span lengths 1..max_span, P(l) proportional to
    p (1 - p)^(l - 1): Geo(p) truncated at ``max_span`` (SpanBERT's ``len_distrib``)."""
    weights = p * (1.0 - p) ** np.arange(max_span, dtype=np.float64)
    return np.cumsum(weights) / weights.sum()


def sample_span_lengths(n: int, p: float, max_span: int, generator: torch.Generator) -> torch.Tensor:
    """``n`` span lengths in [1, max_span] drawn from :func:`span_length_cdf` (int64, shape [n])."""
    cdf = torch.from_numpy(span_length_cdf(p, max_span))
    draws = torch.rand(n, generator=generator, dtype=torch.float64)
    return (torch.searchsorted(cdf, draws, right=True) + 1).clamp_(max=max_span)


def select_spans(batch: Batch, options: SpanOptions, generator: torch.Generator
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Choose spans of whole words covering about ``mask_prob`` of the ordinary pieces of each row.

    The row's words are visited in a random order; from each word not yet
    hidden a span starts, of a length drawn from :func:`span_length_cdf`, and
    hides that many words from there, stopping early at a special token, at a
    word already hidden or at the end of the row. A word is added while the
    budget (``mask_prob`` x ordinary pieces) is not yet reached at its
    midpoint, so the expected count matches the budget. A row with any
    ordinary piece gets at least one word. Words are those of wwm's find_words.

    Returns ``(selected, span)``: a boolean [batch, seq] mask and, at the
    selected positions, the position where their span starts (for a per-span
    replacement decision).
    """
    attention = batch["attention_mask"]
    selected, span = _select_kernel(
        kernel_seed(generator), as_numpy(attention), as_numpy(batch["special_tokens_mask"]),
        as_numpy(batch["word_starts"]), options.mask_prob, span_length_cdf(options.p, options.max_span))
    return torch.from_numpy(selected).to(attention.device), torch.from_numpy(span).to(attention.device)


@njit(cache=True, nogil=True)
def _choose_spans(attention, special, word_starts, mask_prob, cdf):
    rows, length = attention.shape
    selected = np.zeros((rows, length), np.bool_)
    span = np.zeros((rows, length), np.int64)
    first, pieces = np.empty(length, np.int64), np.empty(length, np.int64)
    stretch, order = np.empty(length, np.int64), np.empty(length, np.int64)
    hidden = np.empty(length, np.bool_)
    for r in range(rows):
        n_words, total = find_words(attention, special, word_starts, r, first, pieces, stretch)
        budget = np.float32(total) * np.float32(mask_prob)
        order[:n_words] = np.arange(n_words)
        hidden[:n_words] = False
        count, full = 0, False
        for i in range(n_words):  # the words in a random order (Fisher-Yates)
            t = np.random.randint(i, n_words)
            order[i], order[t] = order[t], order[i]
            start = order[i]
            if hidden[start]:
                continue
            span_length = min(np.searchsorted(cdf, np.random.random(), side="right") + 1, len(cdf))
            for w in range(start, min(start + span_length, n_words)):
                if hidden[w] or stretch[w] != stretch[start]:
                    break
                full = count > 0 and count + pieces[w] / 2 >= budget
                if full:
                    break
                hidden[w] = True
                count += pieces[w]
                selected[r, first[w]:first[w] + pieces[w]] = True
                span[r, first[w]:first[w] + pieces[w]] = first[start]
            if full:
                break
    return selected, span


@njit(cache=True, nogil=True)
def _select_kernel(seed, attention, special, word_starts, mask_prob, cdf):
    np.random.seed(seed)
    return _choose_spans(attention, special, word_starts, mask_prob, cdf)


@njit(cache=True, nogil=True)
def _mask_kernel(seed, ids, attention, special, word_starts, ordinary, mask_id, mask_prob, cdf,
                 mask_ratio, random_ratio):
    np.random.seed(seed)
    selected, span = _choose_spans(attention, special, word_starts, mask_prob, cdf)
    return replace_loop(ids, selected, span, ordinary, mask_id, mask_ratio, random_ratio)


def build(options: SpanOptions, context: BuildContext) -> Objective:
    check_span_options(options)
    if not context.has_word_boundaries:
        raise ConfigError("objectives.span: the tokenizer has no word information (it has no "
                          "pre-tokenizer), so spans of whole words cannot be found; use "
                          "objectives.mlm or a tokenizer with a pre-tokenizer")

    cdf = span_length_cdf(options.p, options.max_span)

    def mask(batch: Batch, generator: torch.Generator) -> Batch:
        # select_spans then mlm's replacement per span, in one compiled call
        corrupted, labels = _mask_kernel(
            kernel_seed(generator), as_numpy(batch["input_ids"]), as_numpy(batch["attention_mask"]),
            as_numpy(batch["special_tokens_mask"]), as_numpy(batch["word_starts"]),
            ordinary_ids(context.vocab), context.vocab.mask_id, options.mask_prob, cdf,
            options.mask_ratio, options.random_ratio)
        return with_labels(batch, corrupted, labels)

    return Objective(loss=masked_lm_loss, heads={"mlm": MLMHead}, batch_transform=mask)


@hookimpl
def pretextual_register_objectives(register):
    register(ObjectiveSpec(name="span", build=build, options=SpanOptions,
                           description="Span masking of whole words, 80/10/10 per span (SpanBERT)"))
