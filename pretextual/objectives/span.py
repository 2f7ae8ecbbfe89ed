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

import torch

from pretextual.errors import ConfigError
from pretextual.objectives.mlm import MLMHead, check_masking_options, masked_lm_loss, replace_selected
from pretextual.objectives.wwm import word_index
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


def sample_span_lengths(n: int, p: float, max_span: int, generator: torch.Generator) -> torch.Tensor:
    """``n`` span lengths in [1, max_span], P(l) proportional to p (1 - p)^(l - 1).

    The geometric distribution Geo(p) truncated at ``max_span`` (SpanBERT's
    ``len_distrib``). Returns an int64 tensor of shape [n].
    """
    weights = p * (1.0 - p) ** torch.arange(max_span, dtype=torch.float64)
    cdf = weights.cumsum(0) / weights.sum()
    draws = torch.rand(n, generator=generator, dtype=torch.float64)
    return (torch.searchsorted(cdf, draws, right=True) + 1).clamp_(max=max_span)


def select_spans(batch: Batch, options: SpanOptions, generator: torch.Generator
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Choose spans of whole words covering about ``mask_prob`` of the ordinary pieces of each row.

    Spans are added until the budget (``mask_prob`` x ordinary pieces) is
    reached; a word is added when the budget is not yet reached at its
    midpoint, so the expected count matches the budget. A row with any
    ordinary piece gets at least one word.

    Returns ``(selected, span)``: a boolean [batch, seq] mask and, at the
    selected positions, the position where their span starts (for a per-span
    replacement decision).
    """
    word, candidates = word_index(batch)
    rows, length = word.shape
    first = candidates.clone()  # the first piece of each ordinary word
    first[:, 1:] &= word[:, 1:] != word[:, :-1]
    pieces = torch.zeros_like(word).scatter_add_(1, word, candidates.long()).gather(1, word)
    specials_before = (~candidates).long().cumsum(1)  # equal within a stretch between specials
    n_words = first.sum(1)
    # All random draws at once: a random order of each row's words, and for each
    # word the length of the span that starts there if one does.
    span_lengths = sample_span_lengths(int(n_words.sum()), options.p, options.max_span, generator)
    scores = torch.rand(rows, length, generator=generator)
    scores.masked_fill_(torch.arange(length) >= n_words[:, None], 2.0)
    orders = scores.argsort(dim=1).tolist()
    span_lengths, n_words = span_lengths.tolist(), n_words.tolist()
    # Each row's ordinary words, row after row: first piece, number of pieces, stretch.
    start_at, size = first.nonzero()[:, 1].tolist(), pieces[first].tolist()
    stretch = specials_before[first].tolist()
    budgets = (candidates.sum(1) * options.mask_prob).tolist()
    at_row, at_pos, span_of = [], [], []
    offset = 0  # index of the row's first word in the flat lists
    for row in range(rows):
        n, budget = n_words[row], budgets[row]
        hidden = [False] * n
        count, full = 0, False
        for first_word in orders[row][:n]:
            if hidden[first_word]:
                continue
            span_start = start_at[offset + first_word]
            for w in range(first_word, min(first_word + span_lengths[offset + first_word], n)):
                i = offset + w
                if hidden[w] or stretch[i] != stretch[offset + first_word]:
                    break
                full = count > 0 and count + size[i] / 2 >= budget
                if full:
                    break
                hidden[w] = True
                count += size[i]
                at_pos.extend(range(start_at[i], start_at[i] + size[i]))
                span_of.extend([span_start] * size[i])
            if full:
                break
        at_row.extend([row] * (len(at_pos) - len(at_row)))
        offset += n
    selected = torch.zeros_like(candidates)
    selected[at_row, at_pos] = True
    span = torch.zeros_like(word)
    span[at_row, at_pos] = torch.tensor(span_of, dtype=span.dtype)
    return selected, span


def build(options: SpanOptions, context: BuildContext) -> Objective:
    check_span_options(options)
    if not context.has_word_boundaries:
        raise ConfigError("objectives.span: the tokenizer has no word information (it has no "
                          "pre-tokenizer), so spans of whole words cannot be found; use "
                          "objectives.mlm or a tokenizer with a pre-tokenizer")

    def mask(batch: Batch, generator: torch.Generator) -> Batch:
        selected, span = select_spans(batch, options, generator)
        return replace_selected(batch, selected, context.vocab, options.mask_ratio,
                                options.random_ratio, generator, group=span)

    return Objective(loss=masked_lm_loss, heads={"mlm": MLMHead}, batch_transform=mask)


@hookimpl
def pretextual_register_objectives(register):
    register(ObjectiveSpec(name="span", build=build, options=SpanOptions,
                           description="Span masking of whole words, 80/10/10 per span (SpanBERT)"))
