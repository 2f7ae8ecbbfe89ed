"""Tokenized documents, examples and batches.

Documents are tokenized once and cached as flat arrays (safetensors, no
pickle). Each epoch an example builder turns them into examples (by default
full sentences packed up to the sequence length); batch ``k`` is then a pure
function of ``(seed, k)``: the examples of its epoch in a seeded order, padded
to the longest in the batch and passed through the batch transform (masking)
with a generator seeded from ``(seed, k)``. So masks are dynamic, reproducible
in any DataLoader worker, and resuming at step ``k`` is exact.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from safetensors.numpy import load_file, save_file
from tokenizers import Tokenizer

from pretextual.core.corpus import Document
from pretextual.plugins.api import Batch, BatchTransform, Example, ExampleBuilder, Vocab


class TokenizedDocuments:
    """Documents as flat arrays: token ids, word-start flags, sentence and document offsets."""

    def __init__(self, ids: np.ndarray, word_starts: np.ndarray, sentence_offsets: np.ndarray,
                 document_offsets: np.ndarray, documents: np.ndarray | None = None):
        self.ids = ids
        self.word_starts = word_starts
        self.sentence_offsets = sentence_offsets  # [n_sentences + 1] into ids
        self.document_offsets = document_offsets  # [n_documents + 1] into sentences
        self.documents = np.arange(len(document_offsets) - 1) if documents is None else documents

    @classmethod
    def from_documents(cls, docs: Sequence[Document], tokenizer: Tokenizer) -> "TokenizedDocuments":
        sentences = [s for d in docs for s in d.sentences]
        encodings = tokenizer.encode_batch(sentences, add_special_tokens=False)
        lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
        ids = np.fromiter((i for e in encodings for i in e.ids), dtype=np.int32, count=lengths.sum())
        words = np.fromiter((-1 if w is None else w for e in encodings for w in e.word_ids),
                            dtype=np.int64, count=lengths.sum())
        sentence_offsets = np.concatenate([[0], np.cumsum(lengths)])
        starts = np.ones(len(ids), dtype=np.uint8)
        starts[1:] = words[1:] != words[:-1]
        starts[sentence_offsets[:-1][lengths > 0]] = 1  # every sentence starts a word
        document_offsets = np.concatenate([[0], np.cumsum([len(d.sentences) for d in docs])])
        return cls(ids, starts, sentence_offsets, document_offsets)

    def save(self, path: Path) -> None:
        """Write atomically: a temporary file renamed over the target."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        os.close(fd)
        try:
            save_file({"ids": self.ids, "word_starts": self.word_starts,
                       "sentence_offsets": self.sentence_offsets,
                       "document_offsets": self.document_offsets}, tmp)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    @classmethod
    def load(cls, path: Path) -> "TokenizedDocuments":
        t = load_file(str(path))
        return cls(t["ids"], t["word_starts"], t["sentence_offsets"], t["document_offsets"])

    def subset(self, documents: np.ndarray) -> "TokenizedDocuments":
        """A view holding only the given documents (indices into this view)."""
        return TokenizedDocuments(self.ids, self.word_starts, self.sentence_offsets,
                                  self.document_offsets, self.documents[documents])

    def __len__(self) -> int:
        return len(self.documents)

    def num_sentences(self, doc: int) -> int:
        d = self.documents[doc]
        return int(self.document_offsets[d + 1] - self.document_offsets[d])

    def sentence(self, doc: int, index: int) -> tuple[np.ndarray, np.ndarray]:
        s = self.document_offsets[self.documents[doc]] + index
        a, b = self.sentence_offsets[s], self.sentence_offsets[s + 1]
        return self.ids[a:b], self.word_starts[a:b]

    def num_tokens(self) -> int:
        return int(sum(self.sentence_offsets[self.document_offsets[d + 1]]
                       - self.sentence_offsets[self.document_offsets[d]] for d in self.documents))


def split_documents(docs: TokenizedDocuments, eval_fraction: float, seed: int = 0
                    ) -> tuple[TokenizedDocuments, TokenizedDocuments]:
    """A held-out split by whole documents (at least one on each side when possible)."""
    order = np.random.default_rng(seed).permutation(len(docs))
    n_eval = int(round(len(docs) * eval_fraction))
    if eval_fraction > 0 and len(docs) > 1:
        n_eval = min(max(n_eval, 1), len(docs) - 1)
    return docs.subset(np.sort(order[n_eval:])), docs.subset(np.sort(order[:n_eval]))


def single_segment(tokens: np.ndarray, word_starts: np.ndarray, vocab: Vocab) -> Example:
    """[CLS] tokens [SEP] as an example."""
    n = len(tokens)
    return {
        "input_ids": np.concatenate([[vocab.cls_id], tokens, [vocab.sep_id]]).astype(np.int64),
        "token_type_ids": np.zeros(n + 2, dtype=np.int64),
        "word_starts": np.concatenate([[1], word_starts, [1]]).astype(np.uint8),
    }


def pair_example(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray], vocab: Vocab,
                 **labels) -> Example:
    """[CLS] A [SEP] B [SEP] with token_type_ids 0 for A and 1 for B, plus scalar labels."""
    (ta, wa), (tb, wb) = a, b
    input_ids = np.concatenate([[vocab.cls_id], ta, [vocab.sep_id], tb, [vocab.sep_id]])
    types = np.concatenate([np.zeros(len(ta) + 2), np.ones(len(tb) + 1)])
    starts = np.concatenate([[1], wa, [1], wb, [1]])
    return {"input_ids": input_ids.astype(np.int64), "token_type_ids": types.astype(np.int64),
            "word_starts": starts.astype(np.uint8), **labels}


def truncate_seq_pair(a: list, b: list, max_tokens: int, rng: np.random.Generator) -> None:
    """Trim the longer of two token lists in place, from the front or the back at
    random, until both fit in ``max_tokens`` (Google's truncate_seq_pair)."""
    while len(a) + len(b) > max_tokens:
        longer = a if len(a) > len(b) else b
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


def full_sentences(max_seq_length: int, vocab: Vocab) -> ExampleBuilder:
    """The default builder (RoBERTa's FULL-SENTENCES): contiguous sentences packed
    up to the sequence length, crossing document boundaries with an extra [SEP].
    A sentence longer than the sequence length is cut into pieces."""
    max_tokens = max_seq_length - 2

    def build(docs: TokenizedDocuments, rng: np.random.Generator) -> list[Example]:
        examples: list[Example] = []
        ids: list[np.ndarray] = []
        starts: list[np.ndarray] = []
        size = 0

        def flush():
            nonlocal ids, starts, size
            if size:
                examples.append(single_segment(np.concatenate(ids), np.concatenate(starts), vocab))
            ids, starts, size = [], [], 0

        for doc in rng.permutation(len(docs)):
            if size:  # document boundary inside an example
                if size + 1 >= max_tokens:
                    flush()
                else:
                    ids.append(np.array([vocab.sep_id], np.int32))
                    starts.append(np.ones(1, np.uint8))
                    size += 1
            for index in range(docs.num_sentences(doc)):
                tokens, word_starts = docs.sentence(doc, index)
                for at in range(0, max(len(tokens), 1), max_tokens):
                    piece, piece_starts = tokens[at:at + max_tokens], word_starts[at:at + max_tokens]
                    if size + len(piece) > max_tokens:
                        flush()
                    ids.append(piece)
                    starts.append(piece_starts)
                    size += len(piece)
        flush()
        return examples

    return build


def collate(examples: Sequence[Example], vocab: Vocab, pad_to_multiple_of: int = 8) -> Batch:
    """Pad 1-D arrays to the longest example (rounded up), stack scalar labels,
    and add attention_mask and special_tokens_mask."""
    longest = max(len(e["input_ids"]) for e in examples)
    length = -(-longest // pad_to_multiple_of) * pad_to_multiple_of
    batch: Batch = {}
    for key, value in examples[0].items():
        if np.ndim(value) == 0:
            batch[key] = torch.tensor([e[key] for e in examples])
            continue
        fill = {"input_ids": vocab.pad_id, "word_starts": 1}.get(key, 0)
        out = np.full((len(examples), length), fill, dtype=np.int64)
        for row, e in enumerate(examples):
            out[row, :len(e[key])] = e[key]
        batch[key] = torch.from_numpy(out)
    lengths = torch.tensor([len(e["input_ids"]) for e in examples])
    batch["attention_mask"] = (torch.arange(length)[None, :] < lengths[:, None]).long()
    special = torch.zeros(vocab.size, dtype=torch.bool)
    special[list(vocab.special_ids)] = True
    batch["special_tokens_mask"] = special[batch["input_ids"]] & batch["attention_mask"].bool()
    batch["word_starts"] = batch["word_starts"].bool()
    return batch


def _seed(*parts: int) -> int:
    digest = hashlib.sha256(",".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


class Batches(torch.utils.data.Dataset):
    """Micro-batch ``k`` of an endless stream of epochs, a pure function of ``(seed, k)``.

    Use with ``DataLoader(batches, batch_size=None, sampler=indices)``: any number
    of workers yields the same batches, and resuming at ``k`` is exact. With
    several processes, rank ``r`` of ``w`` reads micro-batches ``k*w + r``, so
    the global batch is the same whatever the split into processes and
    accumulation steps.
    """

    def __init__(self, docs: TokenizedDocuments, builder: ExampleBuilder,
                 transform: BatchTransform | None, vocab: Vocab, batch_size: int, seed: int,
                 drop_last: bool = True):
        self.docs, self.builder, self.transform, self.vocab = docs, builder, transform, vocab
        self.drop_last = drop_last  # False keeps a last, smaller batch (for evaluation)
        self.batch_size, self.seed = batch_size, seed
        self._epoch_sizes: list[int] = []  # batches per epoch, for the epochs built so far
        self._epoch, self._examples, self._order = -1, [], np.zeros(0, np.int64)

    def __len__(self) -> int:
        return 1 << 62  # endless; the sampler decides how many are drawn

    def _build_epoch(self, epoch: int) -> None:
        rng = np.random.default_rng(_seed(self.seed, epoch, 1))
        self._examples = self.builder(self.docs, rng)
        self._order = np.random.default_rng(_seed(self.seed, epoch, 2)).permutation(len(self._examples))
        self._epoch = epoch
        if epoch == len(self._epoch_sizes):
            n, size = len(self._examples), self.batch_size
            self._epoch_sizes.append(n // size if self.drop_last else -(-n // size))
            if self._epoch_sizes[-1] == 0:
                raise ValueError(f"an epoch holds {n} examples, fewer than one batch of {size}")

    def epoch_length(self, epoch: int = 0) -> int:
        """Number of batches in ``epoch`` (building the epochs up to it once)."""
        while len(self._epoch_sizes) <= epoch:
            self._build_epoch(len(self._epoch_sizes))
        return self._epoch_sizes[epoch]

    def locate(self, index: int) -> tuple[int, int]:
        """(epoch, batch within the epoch) of global batch ``index``."""
        epoch = 0
        while index >= self.epoch_length(epoch):
            index -= self._epoch_sizes[epoch]
            epoch += 1
        return epoch, index

    def __getitem__(self, index: int) -> Batch:
        epoch, within = self.locate(index)
        if epoch != self._epoch:
            self._build_epoch(epoch)
        start = within * self.batch_size
        examples = [self._examples[i] for i in self._order[start:start + self.batch_size]]
        batch = collate(examples, self.vocab)
        if self.transform is not None:
            generator = torch.Generator().manual_seed(_seed(self.seed, index, 3))
            batch = self.transform(batch, generator)
        return batch
