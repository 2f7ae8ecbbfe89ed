"""Tokenized documents (:mod:`pretextual.core.documents`) -> examples -> batches.

Each epoch an example builder turns them into examples (by default full sentences
packed up to the sequence length), a block of documents at a time so memory does not
grow with the corpus; batch ``k`` is then a pure function of ``(seed, k)``: examples of its
block in a seeded order, padded to the longest in the batch and passed through
the batch transform (masking) with a generator seeded from ``(seed, k)``. So
masks are dynamic, reproducible in any DataLoader worker, and resuming at step
``k`` is exact.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Sequence

import numpy as np
import torch

from pretextual.core.documents import TokenizedDocuments
from pretextual.plugins.api import Batch, BatchTransform, Example, ExampleBuilder, Vocab


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


def full_sentences(max_seq_length: int, vocab: Vocab, document_ids: bool = False) -> ExampleBuilder:
    """The default builder (RoBERTa's FULL-SENTENCES): contiguous sentences packed
    up to the sequence length, crossing document boundaries with an extra [SEP].
    A sentence longer than the sequence length is cut into pieces. With
    ``document_ids``, each example also numbers its tokens' documents from 1 ([CLS]
    belongs to the first, each [SEP] to the document it ends), for attention that stays
    within a document."""
    max_tokens = max_seq_length - 2

    def build(docs: TokenizedDocuments, rng: np.random.Generator) -> list[Example]:
        examples: list[Example] = []
        ids: list[np.ndarray] = []
        starts: list[np.ndarray] = []
        owners: list[int] = []  # the document number of each piece in ids
        size = 0

        def flush():
            nonlocal ids, starts, owners, size
            if size:
                example = single_segment(np.concatenate(ids), np.concatenate(starts), vocab)
                if document_ids:
                    within = np.repeat(owners, [len(piece) for piece in ids])
                    example["document_ids"] = np.concatenate(
                        [[1], within, [within[-1] if len(within) else 1]]).astype(np.int64)
                examples.append(example)
            ids, starts, owners, size = [], [], [], 0

        for doc in rng.permutation(len(docs)):
            if size:  # document boundary inside an example
                if size + 1 >= max_tokens:
                    flush()
                else:
                    ids.append(np.array([vocab.sep_id], np.int32))
                    starts.append(np.ones(1, np.uint8))
                    owners.append(owners[-1])
                    size += 1
            number = owners[-1] + 1 if owners else 1
            for index in range(docs.num_sentences(doc)):
                tokens, word_starts = docs.sentence(doc, index)
                for at in range(0, max(len(tokens), 1), max_tokens):
                    piece, piece_starts = tokens[at:at + max_tokens], word_starts[at:at + max_tokens]
                    if size + len(piece) > max_tokens:
                        flush()
                        number = 1
                    ids.append(piece)
                    starts.append(piece_starts)
                    owners.append(number)
                    size += len(piece)
        flush()
        return examples

    return build


@functools.lru_cache(maxsize=8)
def _special_table(vocab: Vocab) -> np.ndarray:
    """A [vocab.size] boolean lookup table of the special ids, built once per vocabulary
    (Vocab is frozen, so hashable)."""
    table = np.zeros(vocab.size, dtype=bool)
    table[list(vocab.special_ids)] = True
    return table


def collate(examples: Sequence[Example], vocab: Vocab, pad_to_multiple_of: int = 8) -> Batch:
    """Pad 1-D arrays to the longest example (rounded up), stack scalar labels,
    and add attention_mask and special_tokens_mask."""
    # Python's len and max over a few dozen examples: cheaper than NumPy's calls
    sizes = [len(e["input_ids"]) for e in examples]
    length = -(-max(sizes) // pad_to_multiple_of) * pad_to_multiple_of
    total = sum(sizes)
    real = np.arange(length) < np.array(sizes)[:, None]  # [rows, length]: not padding
    batch: Batch = {}
    for key, value in examples[0].items():
        if np.ndim(value) == 0:
            batch[key] = torch.tensor([e[key] for e in examples])
            continue
        values = np.concatenate([e[key] for e in examples])
        if len(values) != total:
            raise ValueError(f"collate: every per-token array of an example must be as long as "
                             f"its input_ids; {key!r} is not")
        if key == "input_ids":
            ids = values.astype(np.int64, copy=False)
            if len(ids) and (ids.min() < 0 or ids.max() >= vocab.size):
                raise ValueError("collate: an input id is outside the vocabulary")
            batch[key] = torch.from_numpy(_pad(ids, real, vocab.pad_id))
            special = _pad(_special_table(vocab)[ids], real, False)
        elif key == "word_starts":  # padding counts as a word start: no word runs into it
            batch[key] = torch.from_numpy(_pad(values.astype(bool, copy=False), real, True))
        else:
            batch[key] = torch.from_numpy(_pad(values.astype(np.int64, copy=False), real, 0))
    batch["attention_mask"] = torch.from_numpy(real.astype(np.int64))
    batch["special_tokens_mask"] = torch.from_numpy(special)
    return batch


def _pad(values: np.ndarray, real: np.ndarray, fill) -> np.ndarray:
    """The rows concatenated in ``values``, placed at the ``real`` positions of a
    [rows, length] array (row-major, the order they were concatenated in), ``fill`` elsewhere."""
    out = np.full(real.shape, fill, values.dtype)
    out[real] = values
    return out


def _seed(*parts: int) -> int:
    digest = hashlib.sha256(",".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


BLOCK_TOKENS = 1 << 20
"""Tokens of documents per block: examples are built, and held, one block at a time."""
RUNS_PER_BLOCK = 16
"""A block gathers this many runs of consecutive documents from across the corpus: mixed
text, read from a few places of the memory-mapped shards rather than from every page."""


class Batches(torch.utils.data.Dataset):
    """Micro-batch ``k`` of an endless stream of epochs, a pure function of ``(seed, k)``.

    Use with ``DataLoader(batches, batch_size=None, sampler=indices)``: any number
    of workers yields the same batches, and resuming at ``k`` is exact. With
    several processes, rank ``r`` of ``w`` reads micro-batches ``k*w + r``, so
    the global batch is the same whatever the split into processes and
    accumulation steps.

    Memory is bounded by a block, not the corpus: the documents are cut into runs
    of consecutive documents, and each epoch deals the runs, in a seeded order,
    into blocks of about ``block_tokens`` tokens (RUNS_PER_BLOCK runs each); the
    example builder runs on one block at a time, and a block's examples, shuffled,
    make its batches (a remainder smaller than a batch is dropped unless
    ``drop_last`` is False). A corpus smaller than one block is one block, as if
    there were none.
    Finding batch ``k`` needs the number of batches of every block before it: a
    block is counted when it is first built, so reading batches in order costs
    nothing extra, while the first read far ahead (a resume) builds each earlier
    block once to count it.
    """

    def __init__(self, docs: TokenizedDocuments, builder: ExampleBuilder,
                 transform: BatchTransform | None, vocab: Vocab, batch_size: int, seed: int,
                 drop_last: bool = True, *, block_tokens: int = BLOCK_TOKENS,
                 micro_per_step: int | None = None):
        self.docs, self.builder, self.transform, self.vocab = docs, builder, transform, vocab
        # micro-batches per optimizer step: batch k is for step k // micro_per_step, whose
        # values scheduled objective options take (None: held-out batches, configured values)
        self.micro_per_step = micro_per_step
        self.drop_last = drop_last  # False keeps a last, smaller batch per block (for evaluation)
        self.batch_size, self.seed = batch_size, seed
        tokens = docs.num_tokens()
        self.num_blocks = max(1, min(len(docs), -(-tokens // block_tokens)))
        self._runs = max(1, min(self.num_blocks * RUNS_PER_BLOCK, len(docs)))
        self._examples: list[list[int | None]] = []  # examples of each block, per epoch, once built
        self._plan: tuple[int, np.ndarray] = (-1, np.zeros(0, np.int64))  # an epoch's order of runs
        self._built: tuple[int, int, list[Example], np.ndarray] = (-1, -1, [], np.zeros(0, np.int64))

    def __len__(self) -> int:
        return 1 << 62  # endless; the sampler decides how many are drawn

    def _block_documents(self, epoch: int, block: int) -> np.ndarray:
        if self._plan[0] != epoch:
            self._plan = (epoch, np.random.default_rng(_seed(self.seed, epoch, 0)).permutation(self._runs))
        n, runs, k = len(self.docs), self._runs, self.num_blocks
        # In file order, so a block reads each run of the memory-mapped shards front to back.
        chosen = np.sort(self._plan[1][block * runs // k:(block + 1) * runs // k])
        return np.concatenate([np.arange(r * n // runs, (r + 1) * n // runs) for r in chosen])

    def _build(self, epoch: int, block: int) -> tuple[list[Example], np.ndarray]:
        """The examples of one block and their seeded order (the last block built is kept)."""
        if self._built[:2] != (epoch, block):
            self._built = (-1, -1, [], np.zeros(0, np.int64))  # never two blocks in memory at once
            docs = self.docs.subset(self._block_documents(epoch, block))
            examples = self.builder(docs, np.random.default_rng(_seed(self.seed, epoch, block, 1)))
            docs.release()
            order = np.random.default_rng(_seed(self.seed, epoch, block, 2)).permutation(len(examples))
            self._built = (epoch, block, examples, order)
            while len(self._examples) <= epoch:
                self._examples.append([None] * self.num_blocks)
            self._examples[epoch][block] = len(examples)
        return self._built[2], self._built[3]

    def _block_batches(self, epoch: int, block: int) -> int:
        known = self._examples[epoch][block] if epoch < len(self._examples) else None
        n = len(self._build(epoch, block)[0]) if known is None else known
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def epoch_length(self, epoch: int = 0) -> int:
        """Number of batches in ``epoch`` (building each of its blocks once to count)."""
        length = sum(self._block_batches(epoch, b) for b in range(self.num_blocks))
        if length == 0:
            n = sum(self._examples[epoch])
            where = "" if self.num_blocks == 1 else f" in any of its {self.num_blocks} blocks"
            raise ValueError(f"an epoch holds {n} examples, fewer than one batch of "
                             f"{self.batch_size}{where}")
        return length

    def available(self, limit: int, epoch: int = 0) -> int:
        """``min(limit, epoch_length(epoch))``, building only the blocks needed to tell
        (an evaluation of a few batches then builds one block, not the whole split)."""
        found = 0
        for block in range(self.num_blocks):
            found += self._block_batches(epoch, block)
            if found >= limit:
                return limit
        return min(limit, self.epoch_length(epoch))

    def _find(self, index: int) -> tuple[int, int, int, int]:
        """(epoch, block, batch within the block, batch within the epoch) of batch ``index``."""
        epoch = 0
        while True:
            known = epoch < len(self._examples) and None not in self._examples[epoch]
            if known and index >= self.epoch_length(epoch):
                index -= self.epoch_length(epoch)
                epoch += 1
                continue
            within = index
            for block in range(self.num_blocks):
                n = self._block_batches(epoch, block)
                if within < n:
                    return epoch, block, within, index
                within -= n
            index -= self.epoch_length(epoch)  # raises when an epoch holds no batch
            epoch += 1

    def locate(self, index: int) -> tuple[int, int]:
        """(epoch, batch within the epoch) of global batch ``index``."""
        epoch, _, _, within = self._find(index)
        return epoch, within

    def __getitem__(self, index: int) -> Batch:
        return self.batch(index, index // self.micro_per_step if self.micro_per_step else None)

    def batch(self, index: int, step: int | None) -> Batch:
        """Batch ``index``, transformed as for optimizer step ``step``."""
        epoch, block, within, _ = self._find(index)
        examples, order = self._build(epoch, block)
        start = within * self.batch_size
        batch = collate([examples[i] for i in order[start:start + self.batch_size]], self.vocab)
        if self.transform is not None:
            generator = torch.Generator().manual_seed(_seed(self.seed, index, 3))
            batch = (self.transform(batch, generator) if step is None
                     else self.transform(batch, generator, step))
        return batch
