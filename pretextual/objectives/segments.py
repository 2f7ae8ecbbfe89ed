"""Sentence segments for the sentence-pair objectives (``nsp`` and ``sop``).

Both cut documents the way Google's create_pretraining_data.py does:
consecutive sentences of a document are gathered into a chunk until the chunk
reaches a target length (``max_seq_length - 3`` tokens, leaving room for
[CLS] A [SEP] B [SEP]; with probability ``short_seq_prob`` a random length in
[2, max_seq_length - 3], so the model also sees short inputs). The chunk is
split at a sentence boundary into segments A and B, and a pair that is too
long is trimmed by ``truncate_seq_pair``. What B is and what the label says
differ per objective; see nsp.py and sop.py.

Also here: the 2-way classifier head on the pooled [CLS] output both use, and
its loss.
"""

from __future__ import annotations

import numpy as np
import torch.nn.functional as F
from torch import nn

from pretextual.core.data import truncate_seq_pair
from pretextual.errors import ConfigError, DataError
from pretextual.plugins.api import Documents, Encoder, ObjectiveOutput, StepInputs

Segment = tuple[np.ndarray, np.ndarray]
"""Token ids and word-start flags of a run of text."""


def check_probability(name: str, key: str, value: float) -> None:
    """Raise ConfigError naming ``objectives.<name>.<key>`` unless value is in [0, 1]."""
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"objectives.{name}.{key} must be in [0, 1], got {value}")


def document_sentences(docs: Documents) -> list[list[Segment]]:
    """Every document's sentences, without any that tokenized to nothing."""
    sentences = []
    for doc in range(len(docs)):
        found = (docs.sentence(doc, index) for index in range(docs.num_sentences(doc)))
        sentences.append([s for s in found if len(s[0])])
    return sentences


def require_two_sentences(name: str, sentences: list[list[Segment]]) -> None:
    """Raise DataError unless some document has two sentences to make a pair from."""
    if not any(len(doc) >= 2 for doc in sentences):
        raise DataError(f"objectives.{name} needs documents of at least two sentences, but no "
                        f"document of the corpus has more than one (in a text corpus a blank "
                        f"line ends a document)")


def target_length(max_num_tokens: int, short_seq_prob: float, rng: np.random.Generator) -> int:
    """Tokens to gather per chunk: usually all, sometimes a random short length."""
    if rng.random() < short_seq_prob:
        return int(rng.integers(2, max_num_tokens + 1))
    return max_num_tokens


def chunk_end(sentences: list[Segment], start: int, target: int) -> int:
    """End (exclusive) of the chunk that begins at sentence ``start``: sentences
    are added until they hold ``target`` tokens or the document ends (always at
    least one)."""
    length = 0
    for end in range(start, len(sentences)):
        length += len(sentences[end][0])
        if length >= target:
            return end + 1
    return len(sentences)


def join(sentences: list[Segment]) -> Segment:
    """One segment made of consecutive sentences."""
    return (np.concatenate([s[0] for s in sentences]), np.concatenate([s[1] for s in sentences]))


def truncate_pair(a: Segment, b: Segment, max_num_tokens: int, rng: np.random.Generator
                  ) -> tuple[Segment, Segment]:
    """Trim the pair to ``max_num_tokens`` with data.truncate_seq_pair (the longer
    segment, from the front or the back at random). Each keeps at least one
    token and a trimmed segment still begins a word."""
    if len(a[0]) + len(b[0]) <= max_num_tokens:
        return a, b
    kept_a, kept_b = list(range(len(a[0]))), list(range(len(b[0])))
    truncate_seq_pair(kept_a, kept_b, max_num_tokens, rng)
    return _slice(a, kept_a), _slice(b, kept_b)


def _slice(segment: Segment, kept: list[int]) -> Segment:
    ids, starts = segment
    lo, hi = kept[0], kept[-1] + 1  # truncation only trims the ends, so what is kept is contiguous
    starts = starts[lo:hi].copy()
    starts[0] = 1
    return ids[lo:hi], starts


def pair_classifier(encoder: Encoder) -> nn.Linear:
    """A 2-way linear classifier of the pooled output (BERT's pooler, ModernBERT's final
    [CLS] vector), initialised as BERT's
    (normal(0, initializer_range) weight, zero bias). Its state is exactly
    ``weight`` [2, hidden] and ``bias`` [2], as Hugging Face's seq_relationship."""
    config = encoder.config
    head = nn.Linear(config.hidden_size, 2)
    nn.init.normal_(head.weight, std=config.initializer_range)
    nn.init.zeros_(head.bias)
    return head


def pair_classification_loss(inputs: StepInputs, head: str, label: str) -> ObjectiveOutput:
    """Cross-entropy of ``heads[head]`` on the pooled output against ``batch[label]``."""
    logits = inputs.heads[head](inputs.encoder_output.pooler_output)
    target = inputs.batch[label]
    loss = F.cross_entropy(logits.float(), target)
    accuracy = (logits.argmax(-1) == target).float().mean()
    return ObjectiveOutput(loss=loss, metrics={"accuracy": accuracy})
