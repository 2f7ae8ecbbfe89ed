"""The masking shared by ``mlm``, ``wwm`` and ``span``: choose positions, then apply
the 80/10/10 rule and add ``mlm_labels``.

Masking runs in the data pipeline, once per batch, as vectorised torch operations
over the [batch, seq] tensors. Every random number is drawn from the batch's
``torch.Generator``, so a batch is a pure function of the generator's seed, in any
DataLoader worker. The work is done on the generator's device (the CPU, for the
data pipeline's generators) and the results are moved to the batch's device.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from pretextual.errors import ConfigError
from pretextual.plugins.api import Batch, BuildContext, Vocab

IGNORE_INDEX = -100
"""The label of a position that is not predicted (torch's cross_entropy default)."""

WHOLE_WORDS = np.ones(1)
"""The span-length distribution (cumulative) with all its mass on one word: spans are whole words."""


def require_word_boundaries(name: str, context: BuildContext) -> None:
    """Raise ConfigError naming ``objectives.<name>`` when the tokenizer gives no words
    (no pre-tokenizer), which the whole-word masking of ``wwm`` and ``span`` needs."""
    if not context.has_word_boundaries:
        raise ConfigError(f"objectives.{name}: the tokenizer has no word information (it has no "
                          f"pre-tokenizer), so whole words cannot be found; use objectives.mlm "
                          f"or a tokenizer with a pre-tokenizer")


@functools.lru_cache(maxsize=8)
def ordinary_ids(vocab: Vocab) -> torch.Tensor:
    """``vocab.ordinary_ids()``, computed once per vocabulary (Vocab is frozen)."""
    return vocab.ordinary_ids()


def _check_shape(batch: Batch, name: str, t: torch.Tensor) -> None:
    # A mismatch would broadcast silently or fail deep inside an index operation.
    if tuple(t.shape) != tuple(batch["input_ids"].shape):
        raise ValueError(f"{name} has shape {tuple(t.shape)}, the batch's input_ids "
                         f"{tuple(batch['input_ids'].shape)}")


def _candidates(batch: Batch, generator: torch.Generator) -> torch.Tensor:
    """Where the ordinary tokens are (neither special nor padding), on the generator's device."""
    for name in ("attention_mask", "special_tokens_mask"):
        _check_shape(batch, name, batch[name])
    attention = batch["attention_mask"].to(generator.device)
    special = batch["special_tokens_mask"].to(generator.device)
    return (attention != 0) & ~special.bool()


# --- the transforms ----------------------------------------------------------------------------

def mask_tokens(batch: Batch, vocab: Vocab, mask_prob: float, mask_ratio: float,
                random_ratio: float, generator: torch.Generator) -> Batch:
    """``mlm``: round(mask_prob * n) of the n ordinary tokens of each row (at least one),
    every such set equally likely, then the 80/10/10 rule per token."""
    selected = select_tokens(batch, mask_prob, generator)
    return _replace(batch, selected, None, vocab, mask_ratio, random_ratio, generator)


def mask_spans(batch: Batch, vocab: Vocab, mask_prob: float, span_cdf: np.ndarray,
               mask_ratio: float, random_ratio: float, generator: torch.Generator) -> Batch:
    """``span`` (and ``wwm``, with ``span_cdf=WHOLE_WORDS``): spans of whole words.

    The words of a row (see :func:`find_words`) are visited in a random order;
    from each word not yet hidden a span starts, its length in words drawn from
    ``span_cdf`` (P(length <= l) for l = 1, 2, ...), and hides that many words from
    there, stopping early at a special token, at a word already hidden or at the
    end of the row. A word is hidden while the budget (``mask_prob`` x ordinary
    pieces) is not yet reached at its midpoint, so a word that straddles the
    budget is hidden as often as it is left and the expected count matches the
    budget; a row with any ordinary piece gets at least one word. Then the
    80/10/10 rule, decided once per span (each randomly replaced piece gets a
    token of its own).
    """
    _check_shape(batch, "word_starts", batch["word_starts"])
    candidates = _candidates(batch, generator)
    word_starts = batch["word_starts"].to(generator.device).bool()
    selected, span = choose_spans(candidates, word_starts, mask_prob, span_cdf, generator)
    return _replace(batch, selected, span, vocab, mask_ratio, random_ratio, generator)


def select_tokens(batch: Batch, mask_prob: float, generator: torch.Generator) -> torch.Tensor:
    """Choose round(mask_prob * n) of the n ordinary tokens of each row (at least one).

    A fixed count per row, as Google's create_pretraining_data.py draws, so no
    row goes without a prediction; every set of that many ordinary tokens is
    equally likely. Returns a boolean [batch, seq] mask.
    """
    candidates = _candidates(batch, generator)
    n = candidates.sum(1)
    k = (n * mask_prob).round().long().clamp_(min=1).minimum(n)
    # The k smallest of independent uniform keys are a uniform k-subset; keys above 1 put
    # the other positions after every candidate.
    keys = torch.rand(candidates.shape, generator=generator, dtype=torch.float64,
                      device=generator.device).masked_fill_(~candidates, 2.0)
    most = int(k.max()) if len(k) else 0
    smallest = keys.topk(most, dim=1, largest=False).indices  # smallest first
    first_k = torch.arange(most, device=generator.device) < k[:, None]
    selected = torch.zeros_like(candidates).scatter_(1, smallest, first_k)
    return selected.to(batch["attention_mask"].device)


def replace_selected(batch: Batch, selected: torch.Tensor, vocab: Vocab, mask_ratio: float,
                     random_ratio: float, generator: torch.Generator,
                     group: torch.Tensor | None = None) -> Batch:
    """Apply the 80/10/10 rule at the ``selected`` positions and add ``mlm_labels``.

    ``group`` ([batch, seq] ints in [0, seq)) makes the decision once per
    group (a word or a span) instead of once per token; each randomly replaced
    position still gets a token of its own. Random tokens are drawn from the
    ordinary vocabulary only, never special tokens.
    """
    _check_shape(batch, "selected", selected)
    if group is not None:
        _check_shape(batch, "group", group)
        group = group.to(generator.device, torch.long)
        length = group.shape[1]
        if group.numel() and (group.min() < 0 or group.max() >= length):
            raise ValueError(f"group values must be positions in [0, {length}), "
                             f"got {int(group.min())} to {int(group.max())}")
    return _replace(batch, selected, group, vocab, mask_ratio, random_ratio, generator)


def _replace(batch: Batch, selected: torch.Tensor, group: torch.Tensor | None, vocab: Vocab,
             mask_ratio: float, random_ratio: float, generator: torch.Generator) -> Batch:
    """:func:`replace_selected` for checked inputs."""
    device = generator.device
    ids = batch["input_ids"].to(device, torch.long)
    selected = selected.to(device, torch.bool)
    decision = torch.rand(ids.shape, generator=generator, device=device)
    if group is not None:  # one draw per group: its positions read the draw at the group's value
        decision = decision.gather(1, group)
    to_mask = selected & (decision < mask_ratio)
    to_random = selected & (decision < mask_ratio + random_ratio) & ~to_mask
    ordinary = ordinary_ids(vocab).to(device)
    random_ids = ordinary.take(torch.randint(len(ordinary), ids.shape, generator=generator,
                                             device=device))
    corrupted = torch.where(to_random, random_ids, ids.masked_fill(to_mask, vocab.mask_id))
    labels = ids.masked_fill(~selected, IGNORE_INDEX)
    out = batch["input_ids"].device
    return {**batch, "input_ids": corrupted.to(out), "mlm_labels": labels.to(out)}


# --- whole words and spans -----------------------------------------------------------------------

@dataclass(frozen=True)
class Words:
    """The words of each row that hold ordinary pieces, numbered 0, 1, ... from the left.

    Per-word tensors have a slot per position of the row ([rows, seq], like the
    per-position ones); the slots past a row's last word have no pieces.
    """

    of: torch.Tensor
    """[rows, seq] int64: the word of each ordinary piece (meaningless at other positions)."""
    first: torch.Tensor
    """[rows, seq] int64: the position of each word's first piece (0 past the last word)."""
    pieces: torch.Tensor
    """[rows, seq] int64: the number of pieces of each word."""
    opens_stretch: torch.Tensor
    """[rows, seq] bool: whether a word comes right after a special token, padding or the row's
    start (a span never crosses into it); True past the last word."""


def find_words(candidates: torch.Tensor, word_starts: torch.Tensor) -> Words:
    """The words of the ordinary pieces ``candidates``: a word is a word start and the
    ordinary pieces after it; a special token or padding ends it."""
    rows, length = candidates.shape
    after_candidate = F.pad(candidates[:, :-1], (1, 0))
    starts = candidates & (word_starts | ~after_candidate)
    of = starts.cumsum(1) - 1
    # Per-word values are scattered from the positions into the word slots; positions that
    # write nothing go to a spare slot past the end, dropped.
    spare = torch.full_like(of, length)
    slot, start_slot = torch.where(candidates, of, spare), torch.where(starts, of, spare)
    positions = torch.arange(length, device=of.device).expand(rows, length)
    pieces = of.new_zeros(rows, length + 1).scatter_add_(1, slot, candidates.long())
    first = of.new_zeros(rows, length + 1).scatter_(1, start_slot, positions)
    opens = candidates.new_ones(rows, length + 1).scatter_(1, start_slot, ~after_candidate)
    return Words(of, first[:, :length], pieces[:, :length], opens[:, :length])


def span_lengths(cdf: np.ndarray, shape: tuple[int, ...],
                 generator: torch.Generator) -> torch.Tensor:
    """Span lengths in words, 1 to len(cdf), drawn from the cumulative distribution ``cdf``
    (P(length <= l) for l = 1, 2, ...): an int64 tensor of ``shape``."""
    device = generator.device
    if len(cdf) == 1:  # no draw needed
        return torch.ones(shape, dtype=torch.long, device=device)
    cdf = torch.as_tensor(cdf, dtype=torch.float64, device=device)
    u = torch.rand(shape, generator=generator, dtype=torch.float64, device=device) * cdf[-1]
    return (torch.searchsorted(cdf, u, right=True) + 1).clamp_(max=len(cdf))


def span_starts(key: torch.Tensor, lengths: torch.Tensor, opens_stretch: torch.Tensor,
                longest: int) -> torch.Tensor:
    """For each word ([rows, words]), the word its span starts at, when each word in turn
    (smallest ``key`` first) starts a span of ``lengths`` words (at most ``longest``) unless
    a span already hides it.

    From left to right: word w continues the span that holds word w-1 when that span is
    long enough, started before w's turn (a smaller key) and w does not open a stretch;
    otherwise w starts a span of its own. (A span reaches w only through w-1, so this is
    the turn-by-turn process exactly.) The state carried along is the distance from a word
    back to its span's start, below ``longest``; so each word is a small transition table
    (distance at w-1 -> distance at w), and the scan composes the tables in log2(words)
    rounds of gathers (a parallel prefix scan) instead of a loop over the words.
    """
    rows, words = key.shape
    w = torch.arange(words, device=key.device)
    if longest == 1:  # every span is one word
        return w.expand(rows, words)
    distance = torch.arange(longest, device=key.device)
    previous = w[:, None] - 1 - distance  # [words, longest]: the start of w-1's span, by distance
    at = previous.clamp(min=0)
    continues = ((previous >= 0) & (distance + 1 < lengths[:, at]) & (key[:, at] < key[:, :, None])
                 & ~opens_stretch[:, :, None])
    table = torch.where(continues, distance + 1, 0)  # [rows, words, longest]
    # After the round of shift s, table[:, w] maps the distance before word w - 2s + 1 to
    # the distance at w (the first word's table maps every distance to 0).
    shift = 1
    while shift < words:
        table = torch.cat([table[:, :shift], table[:, shift:].gather(2, table[:, :-shift])], 1)
        shift *= 2
    return w - table[:, :, 0]


def choose_spans(candidates: torch.Tensor, word_starts: torch.Tensor, mask_prob: float,
                 cdf: np.ndarray, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The selection of :func:`mask_spans`: a boolean [rows, seq] mask and, at the selected
    positions, the position where their span starts."""
    words = find_words(candidates, word_starts)
    shape = candidates.shape
    # The turns: a uniform key per word is a uniform order; slots with no word come last.
    key = torch.rand(shape, generator=generator, dtype=torch.float64, device=generator.device)
    key.masked_fill_(words.pieces == 0, 2.0)
    start = span_starts(key, span_lengths(cdf, shape, generator), words.opens_stretch, len(cdf))
    # Words are hidden span by span in the order of their turns, left to right within a span
    # (a stable sort); the budget keeps the words hidden before it is reached.
    order = key.gather(1, start).argsort(dim=1, stable=True)
    pieces = words.pieces.gather(1, order)
    before = pieces.cumsum(1) - pieces
    budget = candidates.sum(1, keepdim=True) * mask_prob
    misfit = (before > 0) & (before + pieces / 2 >= budget)
    hidden_in_order = misfit.cumsum(1) == 0  # every word before the first misfit
    hidden = torch.zeros_like(hidden_in_order).scatter_(1, order, hidden_in_order)
    word = words.of.clamp(min=0)  # (off the words: any word, dropped by the candidates)
    selected = candidates & hidden.gather(1, word)
    span = words.first.gather(1, start).gather(1, word)
    return selected, span
