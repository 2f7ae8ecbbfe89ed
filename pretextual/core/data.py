"""Tokenized documents, examples and batches.

Documents are tokenized once into flat arrays: cached in memory-sized
safetensors, or memory-mapped from the .npy shards of a prepared corpus
(pretextual prepare; no pickle either way). Each epoch an example builder
turns them into examples (by default full sentences packed up to the sequence
length), a block of documents at a time so memory does not grow with the
corpus; batch ``k`` is then a pure function of ``(seed, k)``: examples of its
block in a seeded order, padded to the longest in the batch and passed through
the batch transform (masking) with a generator seeded from ``(seed, k)``. So
masks are dynamic, reproducible in any DataLoader worker, and resuming at step
``k`` is exact.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import mmap
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch
from safetensors.numpy import load_file, save_file
from tokenizers import Tokenizer

from pretextual.core.corpus import Document
from pretextual.core.files import atomic_path
from pretextual.plugins.api import Batch, BatchTransform, Example, ExampleBuilder, Vocab


@dataclass(frozen=True)
class _Mapped:
    """One .npy file mapped into memory: where its data starts, the map, the array over it."""

    path: Path
    offset: int
    map: mmap.mmap | None  # None for an empty array (nothing to map)
    array: np.ndarray


def _map_npy(path: Path) -> _Mapped:
    """Memory-map the 1-D array of a .npy file, read-only; plain dtypes only (no pickle)."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        if version not in ((1, 0), (2, 0)):
            raise ValueError(f"unsupported .npy format version {version}")
        read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                       else np.lib.format.read_array_header_2_0)
        shape, fortran_order, dtype = read_header(f)
        if len(shape) != 1 or dtype.hasobject:
            raise ValueError(f"expected a 1-D array of numbers, found shape {shape} of {dtype}")
        offset = f.tell()
        if shape[0] == 0:
            return _Mapped(path, offset, None, np.zeros(0, dtype))
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return _Mapped(path, offset, mapped, np.frombuffer(mapped, dtype, shape[0], offset))


class Shard:
    """One set of document arrays: token ids, word-start flags, and sentence and document
    offsets; in memory, or memory-mapped from .npy files (``Shard.map``) and read in place."""

    FIELDS = ("ids", "word_starts", "sentence_offsets", "document_offsets")

    def __init__(self, ids: np.ndarray, word_starts: np.ndarray, sentence_offsets: np.ndarray,
                 document_offsets: np.ndarray):
        self.ids, self.word_starts = ids, word_starts
        self.sentence_offsets = sentence_offsets  # [n_sentences + 1] into ids
        self.document_offsets = document_offsets  # [n_documents + 1] into sentences
        self.maps: dict[str, _Mapped] = {}
        self._document_tokens: np.ndarray | None = None

    @classmethod
    def map(cls, files: dict[str, Path]) -> "Shard":
        """A shard over .npy files (one per field), memory-mapped: never loaded whole.
        Raises ValueError for a file that is not a .npy array of plain numbers."""
        maps = {}
        for name in cls.FIELDS:
            try:
                maps[name] = _map_npy(Path(files[name]))
            except ValueError as exc:
                raise ValueError(f"{files[name]}: not a .npy array ({exc})") from None
        shard = cls(**{name: m.array for name, m in maps.items()})
        shard.maps = maps
        return shard

    @property
    def num_documents(self) -> int:
        return len(self.document_offsets) - 1

    def __getstate__(self) -> dict:  # a mapped shard travels as its file names, not its bytes
        if self.maps:
            return {"files": {name: str(m.path) for name, m in self.maps.items()}}
        return {name: getattr(self, name) for name in self.FIELDS}

    def __setstate__(self, state: dict) -> None:
        shard = Shard.map(state["files"]) if "files" in state else Shard(**state)
        self.__dict__.update(shard.__dict__)

    def release(self) -> None:
        """Let go of the mapped pages read so far (they stay in the page cache): the
        process's RSS then holds the block being read, not every page ever read."""
        for mapped in self.maps.values():
            if mapped.map is not None and hasattr(mmap, "MADV_DONTNEED"):
                mapped.map.madvise(mmap.MADV_DONTNEED)

    def chunks(self, name: str, size: int = 1 << 20, overlap: int = 0
               ) -> Iterator[tuple[int, np.ndarray]]:
        """(start, piece) of one array in pieces of ``size`` (plus ``overlap`` more). A
        memory-mapped array is read with plain reads: a whole-array scan then leaves no
        pages mapped into the process, so its RSS does not grow with the corpus."""
        array, mapped = getattr(self, name), self.maps.get(name)
        for at in range(0, len(array), size):
            count = min(size + overlap, len(array) - at)
            if mapped is None:
                yield at, array[at:at + count]
            else:
                yield at, np.fromfile(mapped.path, array.dtype, count,
                                      offset=mapped.offset + at * array.itemsize)

    def document_tokens(self) -> np.ndarray:
        """Tokens of each document (computed once, in one pass over the sentence offsets)."""
        if self._document_tokens is None:
            positions = self.document_offsets.astype(np.int64)
            offsets = np.empty(len(positions), np.int64)
            done = 0
            for at, piece in self.chunks("sentence_offsets"):
                upto = int(np.searchsorted(positions, at + len(piece)))
                offsets[done:upto] = piece[positions[done:upto] - at]
                done = upto
            self._document_tokens = np.diff(offsets)
        return self._document_tokens

    def long_sentence_documents(self, max_tokens: int) -> np.ndarray:
        """For each sentence longer than ``max_tokens``, the document holding it."""
        found = [at + np.flatnonzero(np.diff(piece) > max_tokens)
                 for at, piece in self.chunks("sentence_offsets", overlap=1)]
        sentences = np.concatenate(found) if found else np.zeros(0, np.int64)
        return np.searchsorted(self.document_offsets, sentences, side="right") - 1


class TokenizedDocuments:
    """Documents as flat arrays (see Shard), one set in memory or several memory-mapped
    shards seen as one sequence of documents; a view may hold a subset of them."""

    def __init__(self, ids: np.ndarray, word_starts: np.ndarray, sentence_offsets: np.ndarray,
                 document_offsets: np.ndarray, documents: np.ndarray | None = None):
        self._set([Shard(ids, word_starts, sentence_offsets, document_offsets)], documents)

    def _set(self, shards: list[Shard], documents: np.ndarray | None) -> None:
        self.shards = shards
        self._first = np.cumsum([0] + [s.num_documents for s in shards]).tolist()
        self.documents = np.arange(self._first[-1]) if documents is None else documents

    @classmethod
    def from_shards(cls, shards: Sequence[Shard], documents: np.ndarray | None = None
                    ) -> "TokenizedDocuments":
        """Documents of several shards, in order (the view holds all unless ``documents``)."""
        view = cls.__new__(cls)
        view._set(list(shards), documents)
        return view

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

    def _single(self) -> Shard:
        if len(self.shards) != 1:
            raise AttributeError(f"documents in {len(self.shards)} shards have no single array; "
                                 f"read them with sentence()")
        return self.shards[0]

    ids = property(lambda self: self._single().ids, doc="Token ids (one shard only).")
    word_starts = property(lambda self: self._single().word_starts, doc="Word-start flags (one shard only).")
    sentence_offsets = property(lambda self: self._single().sentence_offsets,
                                doc="[n_sentences + 1] offsets into ids (one shard only).")
    document_offsets = property(lambda self: self._single().document_offsets,
                                doc="[n_documents + 1] offsets into sentences (one shard only).")

    def save(self, path: Path) -> None:
        """Write atomically: a temporary file renamed over the target."""
        shard = self._single()
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            save_file({k: getattr(shard, k) for k in Shard.FIELDS}, str(tmp))

    @classmethod
    def load(cls, path: Path) -> "TokenizedDocuments":
        t = load_file(str(path))
        return cls(t["ids"], t["word_starts"], t["sentence_offsets"], t["document_offsets"])

    def subset(self, documents: np.ndarray) -> "TokenizedDocuments":
        """A view holding only the given documents (indices into this view)."""
        return TokenizedDocuments.from_shards(self.shards, self.documents[documents])

    def __len__(self) -> int:
        return len(self.documents)

    def _locate(self, doc: int) -> tuple[Shard, int]:
        d = int(self.documents[doc])
        if len(self.shards) == 1:
            return self.shards[0], d
        index = bisect.bisect_right(self._first, d) - 1
        return self.shards[index], d - self._first[index]

    def num_sentences(self, doc: int) -> int:
        shard, d = self._locate(doc)
        return int(shard.document_offsets[d + 1] - shard.document_offsets[d])

    def sentence(self, doc: int, index: int) -> tuple[np.ndarray, np.ndarray]:
        shard, d = self._locate(doc)
        s = shard.document_offsets[d] + index
        a, b = shard.sentence_offsets[s], shard.sentence_offsets[s + 1]
        ids = shard.ids[a:b]
        # Prepared shards may store ids as uint16; objectives get int32, as from memory.
        return (ids if ids.dtype == np.int32 else ids.astype(np.int32)), shard.word_starts[a:b]

    def document_lengths(self) -> np.ndarray:
        """Tokens of each document of the view."""
        if len(self.shards) == 1:
            return self.shards[0].document_tokens()[self.documents]
        return np.concatenate([s.document_tokens() for s in self.shards])[self.documents]

    def num_tokens(self) -> int:
        return int(self.document_lengths().sum())

    def release(self) -> None:
        """Let go of the memory-mapped pages read so far (see Shard.release)."""
        for shard in self.shards:
            shard.release()

    def sentences_longer_than(self, max_tokens: int) -> int:
        """How many sentences of the view's documents hold more than ``max_tokens`` tokens."""
        found = [first + s.long_sentence_documents(max_tokens)
                 for first, s in zip(self._first, self.shards)]
        return int(np.isin(np.concatenate(found), self.documents).sum())


MIN_SPLIT_DOCUMENTS = 2
"""Fewest documents on either side of a held-out split: pair objectives (NSP) draw a
random segment from another document."""


def held_out_count(documents: int, eval_fraction: float) -> int:
    """How many documents :func:`split_documents` holds out: ``eval_fraction`` of them,
    rounded, but at least MIN_SPLIT_DOCUMENTS on each side, so none when the corpus has
    fewer than twice that many (or ``eval_fraction`` is 0)."""
    if eval_fraction <= 0 or documents < 2 * MIN_SPLIT_DOCUMENTS:
        return 0
    return min(max(int(round(documents * eval_fraction)), MIN_SPLIT_DOCUMENTS),
               documents - MIN_SPLIT_DOCUMENTS)


def split_documents(docs: TokenizedDocuments, eval_fraction: float, seed: int = 0
                    ) -> tuple[TokenizedDocuments, TokenizedDocuments]:
    """(training, held-out) documents, split by whole documents (:func:`held_out_count`)."""
    order = np.random.default_rng(seed).permutation(len(docs))
    n_eval = held_out_count(len(docs), eval_fraction)
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
                 drop_last: bool = True, *, block_tokens: int = BLOCK_TOKENS):
        self.docs, self.builder, self.transform, self.vocab = docs, builder, transform, vocab
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
        epoch, block, within, _ = self._find(index)
        examples, order = self._build(epoch, block)
        start = within * self.batch_size
        batch = collate([examples[i] for i in order[start:start + self.batch_size]], self.vocab)
        if self.transform is not None:
            generator = torch.Generator().manual_seed(_seed(self.seed, index, 3))
            batch = self.transform(batch, generator)
        return batch
