"""The masking shared by ``mlm``, ``wwm`` and ``span``: choose positions, then apply
the 80/10/10 rule and add ``mlm_labels``.

Masking runs in the data pipeline, once per batch, over small [batch, seq]
arrays. Written as a few dozen torch or NumPy calls it costs their dispatch
(1-10 us each), so each transform is one compiled loop over the rows (numba),
which also draws only the random numbers it uses. Each call seeds numba's
generator (a Mersenne Twister per thread) from the batch's torch.Generator, so a
batch is a pure function of the seed in any DataLoader worker (for a given
numba version). Tensors on another device are masked on the CPU and moved back.

All compiled code lives in this one file: numba's cache notices a change to the
file a function is defined in, not to another file whose functions it calls.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from numba import njit

from pretextual.errors import ConfigError
from pretextual.plugins.api import Batch, BuildContext, Vocab

IGNORE_INDEX = -100
"""The label of a position that is not predicted (torch's cross_entropy default)."""

WHOLE_WORDS = np.ones(1)
"""The span-length distribution (cumulative) with all its mass on one word: spans are whole words."""


def kernel_seed(generator: torch.Generator) -> int:
    """A seed for one compiled masking call, drawn from the batch's generator."""
    return int(torch.randint(2**32, (1,), generator=generator))  # init_genrand takes 32 bits


def as_numpy(t: torch.Tensor) -> np.ndarray:
    """The tensor as a NumPy array (a view of a CPU tensor; the loops never write their inputs)."""
    return t.detach().cpu().numpy()


@functools.lru_cache(maxsize=8)
def ordinary_array(vocab: Vocab) -> np.ndarray:
    """``vocab.ordinary_ids()`` as an array, computed once per vocabulary (Vocab is frozen)."""
    return vocab.ordinary_ids().numpy()


def with_labels(batch: Batch, corrupted: np.ndarray, labels: np.ndarray) -> Batch:
    """The batch with corrupted ``input_ids`` and ``mlm_labels``, on the batch's device."""
    device = batch["input_ids"].device
    return {**batch, "input_ids": torch.from_numpy(corrupted).to(device),
            "mlm_labels": torch.from_numpy(labels).to(device)}


def require_word_boundaries(name: str, context: BuildContext) -> None:
    """Raise ConfigError naming ``objectives.<name>`` when the tokenizer gives no words
    (no pre-tokenizer), which the whole-word masking of ``wwm`` and ``span`` needs."""
    if not context.has_word_boundaries:
        raise ConfigError(f"objectives.{name}: the tokenizer has no word information (it has no "
                          f"pre-tokenizer), so whole words cannot be found; use objectives.mlm "
                          f"or a tokenizer with a pre-tokenizer")


def _same_shape(batch: Batch, name: str, t: torch.Tensor) -> None:
    # The compiled loops do not check bounds: a mismatch must not reach them.
    if tuple(t.shape) != tuple(batch["input_ids"].shape):
        raise ValueError(f"{name} has shape {tuple(t.shape)}, the batch's input_ids "
                         f"{tuple(batch['input_ids'].shape)}")


# --- the transforms ----------------------------------------------------------------------------

def mask_tokens(batch: Batch, vocab: Vocab, mask_prob: float, mask_ratio: float,
                random_ratio: float, generator: torch.Generator) -> Batch:
    """``mlm``: round(mask_prob * n) of the n ordinary tokens of each row (at least one),
    every such set equally likely, then the 80/10/10 rule per token."""
    corrupted, labels = _mask_tokens_kernel(
        kernel_seed(generator), as_numpy(batch["input_ids"]), as_numpy(batch["attention_mask"]),
        as_numpy(batch["special_tokens_mask"]), ordinary_array(vocab), vocab.mask_id,
        mask_prob, mask_ratio, random_ratio)
    return with_labels(batch, corrupted, labels)


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
    corrupted, labels = _mask_spans_kernel(
        kernel_seed(generator), as_numpy(batch["input_ids"]), as_numpy(batch["attention_mask"]),
        as_numpy(batch["special_tokens_mask"]), as_numpy(batch["word_starts"]),
        ordinary_array(vocab), vocab.mask_id, mask_prob, span_cdf, mask_ratio, random_ratio)
    return with_labels(batch, corrupted, labels)


def select_tokens(batch: Batch, mask_prob: float, generator: torch.Generator) -> torch.Tensor:
    """Choose round(mask_prob * n) of the n ordinary tokens of each row (at least one).

    A fixed count per row, as Google's create_pretraining_data.py draws, so no
    row goes without a prediction; every set of that many ordinary tokens is
    equally likely. Returns a boolean [batch, seq] mask.
    """
    attention = batch["attention_mask"]
    for name in ("attention_mask", "special_tokens_mask"):
        _same_shape(batch, name, batch[name])
    selected = _select_tokens_kernel(kernel_seed(generator), as_numpy(attention),
                                     as_numpy(batch["special_tokens_mask"]), mask_prob)
    return torch.from_numpy(selected).to(attention.device)


def replace_selected(batch: Batch, selected: torch.Tensor, vocab: Vocab, mask_ratio: float,
                     random_ratio: float, generator: torch.Generator,
                     group: torch.Tensor | None = None) -> Batch:
    """Apply the 80/10/10 rule at the ``selected`` positions and add ``mlm_labels``.

    ``group`` ([batch, seq] ints in [0, seq)) makes the decision once per
    group (a word or a span) instead of once per token; each randomly replaced
    position still gets a token of its own. Random tokens are drawn from the
    ordinary vocabulary only, never special tokens.
    """
    input_ids = batch["input_ids"]
    _same_shape(batch, "selected", selected)
    groups = None
    if group is not None:
        _same_shape(batch, "group", group)
        groups = as_numpy(group)
        if groups.size and (groups.min() < 0 or groups.max() >= groups.shape[1]):
            raise ValueError(f"group values must be positions in [0, {groups.shape[1]}), "
                             f"got {groups.min()} to {groups.max()}")
    corrupted, labels = _replace_kernel(
        kernel_seed(generator), as_numpy(input_ids), as_numpy(selected), groups,
        ordinary_array(vocab), vocab.mask_id, mask_ratio, random_ratio)
    return with_labels(batch, corrupted, labels)


# --- the compiled loops --------------------------------------------------------------------------

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
def span_length(cdf):
    """One span length in words, 1 to len(cdf), from the cumulative distribution ``cdf``."""
    if len(cdf) == 1:
        return 1
    return min(np.searchsorted(cdf, np.random.random() * cdf[-1], side="right") + 1, len(cdf))


@njit(cache=True, nogil=True)
def choose_tokens(attention, special, mask_prob):
    """A boolean [rows, seq] mask of round(mask_prob * n) of each row's n ordinary tokens
    (at least one): the first k places of a Fisher-Yates shuffle, a uniform k-subset."""
    rows, length = attention.shape
    selected = np.zeros((rows, length), np.bool_)
    candidates = np.empty(length, np.int64)
    for r in range(rows):
        n = 0
        for j in range(length):
            if attention[r, j] != 0 and not special[r, j]:
                candidates[n] = j
                n += 1
        # float32, as torch rounds n * mask_prob for an integer tensor
        k = min(max(int(np.round(np.float32(n) * np.float32(mask_prob))), 1), n)
        for i in range(k):
            t = np.random.randint(i, n)
            candidates[i], candidates[t] = candidates[t], candidates[i]
            selected[r, candidates[i]] = True
    return selected


@njit(cache=True, nogil=True)
def choose_spans(attention, special, word_starts, mask_prob, cdf):
    """The selection of :func:`mask_spans`: a boolean [rows, seq] mask and, at the selected
    positions, the position where their span starts."""
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
            for w in range(start, min(start + span_length(cdf), n_words)):
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
def replace(ids, selected, group, ordinary, mask_id, mask_ratio, random_ratio):
    """The 80/10/10 rule at the selected positions: (corrupted ids, labels). The decision is
    drawn once per group (``group`` None: per position); random tokens come from ``ordinary``."""
    rows, length = ids.shape
    corrupted = ids.astype(np.int64)
    labels = np.full((rows, length), IGNORE_INDEX, np.int64)
    decision = np.empty(length)  # per group of the row; -1 until drawn
    for r in range(rows):
        decision[:] = -1.0
        for j in range(length):
            if not selected[r, j]:
                continue
            labels[r, j] = ids[r, j]
            g = j if group is None else group[r, j]
            if decision[g] < 0:
                decision[g] = np.random.random()
            if decision[g] < mask_ratio:
                corrupted[r, j] = mask_id
            elif decision[g] < mask_ratio + random_ratio:
                corrupted[r, j] = ordinary[np.random.randint(0, len(ordinary))]
    return corrupted, labels


# Entry points: each seeds the generator, then runs the loops above in one call.

@njit(cache=True, nogil=True)
def _mask_tokens_kernel(seed, ids, attention, special, ordinary, mask_id, mask_prob, mask_ratio,
                        random_ratio):
    np.random.seed(seed)
    selected = choose_tokens(attention, special, mask_prob)
    return replace(ids, selected, None, ordinary, mask_id, mask_ratio, random_ratio)


@njit(cache=True, nogil=True)
def _mask_spans_kernel(seed, ids, attention, special, word_starts, ordinary, mask_id, mask_prob,
                       cdf, mask_ratio, random_ratio):
    np.random.seed(seed)
    selected, span = choose_spans(attention, special, word_starts, mask_prob, cdf)
    return replace(ids, selected, span, ordinary, mask_id, mask_ratio, random_ratio)


@njit(cache=True, nogil=True)
def _select_tokens_kernel(seed, attention, special, mask_prob):
    np.random.seed(seed)
    return choose_tokens(attention, special, mask_prob)


@njit(cache=True, nogil=True)
def _replace_kernel(seed, ids, selected, group, ordinary, mask_id, mask_ratio, random_ratio):
    np.random.seed(seed)
    return replace(ids, selected, group, ordinary, mask_id, mask_ratio, random_ratio)
