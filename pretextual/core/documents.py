"""Tokenized documents: flat arrays of token ids, word starts and sentence and
document offsets, held in memory (cached as safetensors) or memory-mapped from the
.npy shards of a prepared corpus (pretextual prepare; no pickle either way), and
their split into training and held-out documents. :mod:`pretextual.core.data`
turns them into examples and batches.
"""

from __future__ import annotations

import bisect
import mmap
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
from safetensors.numpy import load_file, save_file
from tokenizers import Tokenizer

from pretextual.core.corpus import Document
from pretextual.core.files import atomic_path


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
    def concatenate(cls, views: Sequence["TokenizedDocuments"]) -> "TokenizedDocuments":
        """The documents of several views, one after another, as one view (no copy)."""
        shards, documents, offset = [], [], 0
        for view in views:
            shards += view.shards
            documents.append(view.documents + offset)
            offset += view._first[-1]
        return cls.from_shards(shards, np.concatenate(documents) if documents else None)

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
