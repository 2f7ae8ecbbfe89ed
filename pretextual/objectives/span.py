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

from pretextual.errors import ConfigError
from pretextual.objectives.masking import mask_spans, require_word_boundaries
from pretextual.objectives.mlm import MLMHead, check_masking_options, masked_lm_loss
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

    def check(self, name: str) -> None:
        """Raise ConfigError naming the key for an impossible span configuration (called by
        the core when the config is checked)."""
        if not 0.0 < self.p <= 1.0:
            raise ConfigError(f"objectives.{name}.p must be in (0, 1], got {self.p}")
        if self.max_span < 1:
            raise ConfigError(f"objectives.{name}.max_span must be at least 1, got {self.max_span}")
        check_masking_options(name, self)


def span_length_cdf(p: float, max_span: int) -> np.ndarray:
    """P(length <= l) for l = 1..max_span, P(l) proportional to p (1 - p)^(l - 1): Geo(p)
    truncated at ``max_span`` (SpanBERT's ``len_distrib``)."""
    weights = p * (1.0 - p) ** np.arange(max_span, dtype=np.float64)
    return np.cumsum(weights) / weights.sum()


def build(options: SpanOptions, context: BuildContext) -> Objective:
    """``span`` for a run: mlm's head and loss, masking spans of whole words; ConfigError
    when the tokenizer gives no words."""
    require_word_boundaries("span", context)
    cdf = span_length_cdf(options.p, options.max_span)  # once, not per batch

    def mask(batch: Batch, generator: torch.Generator) -> Batch:
        return mask_spans(batch, context.vocab, options.mask_prob, cdf, options.mask_ratio,
                          options.random_ratio, generator)

    return Objective(loss=masked_lm_loss, heads={"mlm": MLMHead}, batch_transform=mask)


@hookimpl
def pretextual_register_objectives(register):
    register(ObjectiveSpec(name="span", build=build, options=SpanOptions,
                           provides=("batch_transform",),
                           description="Span masking of whole words, 80/10/10 per span (SpanBERT)"))
