"""Held-out probes that put models trained on different objective mixes on one scale.

None of them is a training objective, and every mix gets exactly the same inputs:

* **MLM**: loss and accuracy of the model's ``mlm`` head (shared by mlm, wwm and span) on
  the held-out documents packed as full sentences, masked by the plain ``mlm`` objective's
  transform with its defaults (15% of tokens, 80/10/10) and a fixed seed. A model without
  an ``mlm`` head gets None (reported n/a), not a number from some other head.
* **Pair probe**: each held-out document is cut into segments of up to half a sequence;
  a pair is two segments of one document with at least one segment between them (label
  1), or the same first segment with a segment of another document (label 0). Each
  segment is encoded alone by the frozen encoder; a logistic regression on
  ``[u * v, |u - v|]`` of the two embeddings ([CLS] hidden state, or the mean over the
  tokens) is scored by cross-validation. Documents are dealt into folds first and a
  pair never leaves its fold, so no segment of a test pair is seen in training. Because
  segments are encoded separately and are never adjacent, this is not the NSP or SOP
  task in disguise: it asks whether the embeddings carry what a document is about.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from pretextual.core.data import collate, full_sentences, single_segment
from pretextual.core.documents import TokenizedDocuments
from pretextual.core.mix import PretrainingModel
from pretextual.errors import PretextualError
from pretextual.objectives.mlm import IGNORE_INDEX
from pretextual.plugins.api import Batch, BuildContext
from pretextual.plugins.manager import Plugins

PROBE_SEED = 0
MAX_MLM_EXAMPLES = 1024  # bounds the cost on a large held-out split
PAIRS_PER_DOCUMENT = 32  # positive pairs per document (as many negatives): no document dominates
FOLDS = 5  # at most; each fold needs two documents, for its cross-document pairs
L2 = 0.1  # on standardised features: the features outnumber the pairs of a small held-out split
PROBE_KEYS = ("mlm_loss", "mlm_accuracy", "pair_cls_accuracy", "pair_mean_accuracy")


class ProbeError(PretextualError):
    """Held-out data too small to probe (the message says which setting to raise)."""


@dataclass
class ProbeData:
    """The fixed inputs of the probes, built once and given to every model."""

    mlm_batches: list[Batch]
    segments: list[Batch]
    """Every segment as a single-segment batch row, in batches."""
    pairs: np.ndarray
    """[n, 2] indices into the segments (in batch order)."""
    labels: np.ndarray
    """[n]: 1 same document, 0 different documents."""
    folds: np.ndarray
    """[n]: the cross-validation fold of each pair (that of both its documents)."""
    documents: np.ndarray
    """The corpus indices of the held-out documents everything here comes from."""

    @property
    def mlm_positions(self) -> int:
        return int(sum((b["mlm_labels"] != IGNORE_INDEX).sum() for b in self.mlm_batches))

    def describe(self) -> str:
        """One line on what the probes are measured on."""
        return (f"{len(self.documents)} held-out documents: {self.mlm_positions:,} masked "
                f"positions for MLM, {len(self.labels)} segment pairs "
                f"({int(self.labels.sum())} same-document) for the pair probe")


Segment = tuple[np.ndarray, np.ndarray]  # token ids, word-start flags


def _segments(docs: TokenizedDocuments, doc: int, max_tokens: int) -> list[Segment]:
    """Consecutive sentences of a document gathered into segments of at most ``max_tokens``."""
    segments, ids, starts = [], [], []
    for index in range(docs.num_sentences(doc)):
        tokens, word_starts = docs.sentence(doc, index)
        tokens, word_starts = tokens[:max_tokens], word_starts[:max_tokens]
        if ids and sum(map(len, ids)) + len(tokens) > max_tokens:
            segments.append((np.concatenate(ids), np.concatenate(starts)))
            ids, starts = [], []
        if len(tokens):
            ids.append(tokens)
            starts.append(word_starts)
    if ids:
        segments.append((np.concatenate(ids), np.concatenate(starts)))
    return segments


def _batched(examples: list, batch_size: int, vocab) -> list[Batch]:
    return [collate(examples[i:i + batch_size], vocab) for i in range(0, len(examples), batch_size)]


def _pairs(per_doc: list[list[Segment]], rng: np.random.Generator
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distant same-document pairs and as many cross-document pairs per document, each
    within the fold its documents were dealt into: (pairs, labels, folds)."""
    offsets = np.cumsum([0] + [len(s) for s in per_doc])
    with_text = [d for d, segments in enumerate(per_doc) if segments]
    n_folds = min(FOLDS, len(with_text) // 2)
    if n_folds < 2:
        return np.zeros((0, 2), np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    fold_of = {int(d): k % n_folds for k, d in enumerate(rng.permutation(with_text))}
    pairs, labels, folds = [], [], []
    for doc in with_text:
        segments = per_doc[doc]
        distant = [(i, j) for i in range(len(segments)) for j in range(i + 2, len(segments))]
        others = [d for d in with_text if d != doc and fold_of[d] == fold_of[doc]]
        for k in rng.choice(len(distant), min(PAIRS_PER_DOCUMENT, len(distant)), replace=False):
            i, j = distant[k]
            other = others[rng.integers(len(others))]
            pairs += [(offsets[doc] + i, offsets[doc] + j),
                      (offsets[doc] + i, offsets[other] + rng.integers(len(per_doc[other])))]
            labels += [1, 0]
            folds += [fold_of[doc]] * 2
    return np.array(pairs, dtype=np.int64).reshape(-1, 2), np.array(labels), np.array(folds)


def probe_data(docs: TokenizedDocuments, context: BuildContext, plugins: Plugins,
               batch_size: int) -> ProbeData:
    """The probes' inputs from the held-out documents; a ProbeError when they are too few."""
    vocab, length = context.vocab, context.max_seq_length
    rng = np.random.default_rng(PROBE_SEED)
    examples = full_sentences(length, vocab)(docs, rng)[:MAX_MLM_EXAMPLES]
    spec = plugins.objective("mlm")
    mask = spec.build(spec.options(), context).batch_transform  # the defaults: 15%, 80/10/10
    mlm_batches = [mask(batch, torch.Generator().manual_seed(PROBE_SEED + i))
                   for i, batch in enumerate(_batched(examples, batch_size, vocab))]

    per_doc = [_segments(docs, doc, (length - 2) // 2) for doc in range(len(docs))]
    pairs, labels, folds = _pairs(per_doc, rng)
    if len(np.unique(folds)) < 2:
        raise ProbeError(f"the pair probe needs four held-out documents, some of at least "
                         f"three segments of {(length - 2) // 2} tokens; the held-out split has "
                         f"{len(docs)} documents (raise data.eval_fraction, or use a larger "
                         f"corpus)")
    segments = [single_segment(ids, starts, vocab) for doc in per_doc for ids, starts in doc]
    return ProbeData(mlm_batches, _batched(segments, batch_size, vocab), pairs, labels, folds,
                     docs.documents)


def _encoder_inputs(batch: Batch, device: torch.device) -> dict[str, torch.Tensor]:
    return {k: batch[k].to(device) for k in ("input_ids", "attention_mask", "token_type_ids")}


@torch.no_grad()
def mlm_probe(model: PretrainingModel, data: ProbeData, device: torch.device
              ) -> dict[str, float | None]:
    """Held-out MLM loss (mean cross-entropy per masked position) and accuracy."""
    if "mlm" not in model.heads:
        return {"mlm_loss": None, "mlm_accuracy": None}
    loss, correct, count = 0.0, 0, 0
    for batch in data.mlm_batches:
        labels = batch["mlm_labels"].to(device)
        where = labels != IGNORE_INDEX
        hidden = model.bert(**_encoder_inputs(batch, device)).last_hidden_state
        logits = model.heads["mlm"](hidden[where])
        loss += float(F.cross_entropy(logits.float(), labels[where], reduction="sum"))
        correct += int((logits.argmax(-1) == labels[where]).sum())
        count += int(where.sum())
    return {"mlm_loss": loss / count, "mlm_accuracy": correct / count}


@torch.no_grad()
def segment_embeddings(model: PretrainingModel, data: ProbeData, device: torch.device
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """[CLS] hidden states and token-mean embeddings of every segment, on the CPU."""
    cls, mean = [], []
    for batch in data.segments:
        inputs = _encoder_inputs(batch, device)
        hidden = model.bert(**inputs).last_hidden_state.float()
        mask = inputs["attention_mask"].unsqueeze(-1).float()
        cls.append(hidden[:, 0].cpu())
        mean.append(((hidden * mask).sum(1) / mask.sum(1)).cpu())
    return torch.cat(cls), torch.cat(mean)


def _logistic_regression(x: torch.Tensor, y: torch.Tensor, x_test: torch.Tensor) -> torch.Tensor:
    """Fit an L2-regularised logistic regression on standardised features; predict 0/1."""
    mean, std = x.mean(0), x.std(0) + 1e-6
    x, x_test = (x - mean) / std, (x_test - mean) / std
    w = torch.zeros(x.shape[1], dtype=x.dtype, requires_grad=True)
    b = torch.zeros((), dtype=x.dtype, requires_grad=True)
    optimizer = torch.optim.LBFGS([w, b], max_iter=200, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = F.binary_cross_entropy_with_logits(x @ w + b, y) + L2 * w.square().sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    return (x_test @ w + b > 0).to(y.dtype)


def pair_probe_accuracy(embeddings: torch.Tensor, data: ProbeData) -> float:
    """Cross-validated accuracy of the linear pair probe over the data's folds."""
    u, v = embeddings[data.pairs[:, 0]].double(), embeddings[data.pairs[:, 1]].double()
    features = torch.cat([u * v, (u - v).abs()], dim=1)
    labels = torch.from_numpy(data.labels).double()
    correct = 0
    for fold in np.unique(data.folds):
        test = torch.from_numpy(data.folds == fold)
        with torch.enable_grad():
            predicted = _logistic_regression(features[~test], labels[~test], features[test])
        correct += int((predicted == labels[test]).sum())
    return correct / len(labels)


def run_probes(model: PretrainingModel, data: ProbeData, device: torch.device
               ) -> dict[str, float | None]:
    """Every probe of one model (PROBE_KEYS), with the model in eval mode (no dropout)."""
    was_training = model.training
    model.eval()
    try:
        cls, mean = segment_embeddings(model, data, device)
        return {**mlm_probe(model, data, device),
                "pair_cls_accuracy": pair_probe_accuracy(cls, data),
                "pair_mean_accuracy": pair_probe_accuracy(mean, data)}
    finally:
        model.train(was_training)
