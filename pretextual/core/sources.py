"""Several corpora mixed by weight (data.sources): their shared tokenizer, each one's
documents, and a batch stream in which each source has its weight's share.

Each micro-batch comes from one source. In every block of MIX_BLOCK batches source i
gives ``quota_i`` of them (MIX_BLOCK x its share, rounded by largest remainder),
interleaved evenly (source i's j-th batch of the block at time (j + 0.5) / quota_i), so
after any number of batches each source's count is within a batch or two of its share,
and batch k is a pure function of k: resuming is exact, and DataLoader workers agree.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from tokenizers import Tokenizer

from pretextual.core.corpus import corpus_fingerprint, read_corpus
from pretextual.core.documents import TokenizedDocuments
from pretextual.core.files import atomic_write_text
from pretextual.core.prepare import tokenized_corpus, train_tokenizer
from pretextual.core.prepared import open_prepared
from pretextual.core.tokenizer import load_tokenizer, tokenizer_sha256
from pretextual.core.config_checks import source_names
from pretextual.errors import DataError

MIX_BLOCK = 1000
"""Batches in which every source gets its exact quota."""


@dataclass
class Source:
    """One source of a mix: its name, its weight as configured (None: from its size),
    and its tokenized documents."""

    name: str
    weight: float | None
    docs: TokenizedDocuments


def shares(sources: list[Source], temperature: float | None) -> np.ndarray:
    """Each source's share of the batches: its weight (1 when unset) over the sum, or
    under a temperature T its size in tokens to the power 1/T over the sum."""
    if temperature is not None:
        raw = np.array([float(s.docs.num_tokens()) for s in sources]) ** (1.0 / temperature)
    else:
        raw = np.array([1.0 if s.weight is None else s.weight for s in sources])
    return raw / raw.sum()


def _quotas(share: np.ndarray, block: int) -> np.ndarray:
    """Batches per source in a block: block x share, rounded by largest remainder."""
    exact = share * block
    quotas = np.floor(exact).astype(np.int64)
    for i in np.argsort(-(exact - quotas), kind="stable")[:block - quotas.sum()]:
        quotas[i] += 1
    return quotas


class MixedBatches(torch.utils.data.Dataset):
    """Micro-batch ``k`` of a mix: batch ``j`` of source ``i``'s own Batches, by the
    even interleaving of the module docstring (a pure function of ``k``)."""

    def __init__(self, sources: list, names: list[str], share: np.ndarray, block: int = MIX_BLOCK):
        self.sources, self.names, self.share = sources, names, share
        self.block = block
        self.quotas = _quotas(share, block)
        times = [((j + 0.5) / q, i, j) for i, q in enumerate(self.quotas) for j in range(q)]
        times.sort()
        self._source = np.array([i for _, i, _ in times], dtype=np.int64)
        self._within = np.array([j for _, _, j in times], dtype=np.int64)
        self.docs = TokenizedDocuments.concatenate([b.docs for b in sources])

    def __len__(self) -> int:
        return 1 << 62  # endless, as each source's Batches

    def locate(self, k: int) -> tuple[int, int]:
        """(source, batch within that source's stream) of micro-batch ``k``."""
        cycle, r = divmod(k, self.block)
        source = int(self._source[r])
        return source, cycle * int(self.quotas[source]) + int(self._within[r])

    def __getitem__(self, k: int):
        source, j = self.locate(k)
        m = self.sources[source].micro_per_step
        return self.sources[source].batch(j, k // m if m else None)  # the step of the mix's k

    def counts(self, n: int) -> np.ndarray:
        """Micro-batches of each source among the first ``n``."""
        cycles, r = divmod(n, self.block)
        return cycles * self.quotas + np.bincount(self._source[:r], minlength=len(self.sources))

    def epoch_length(self, epoch: int = 0) -> int:
        """Micro-batches until the first source starts its second epoch."""
        return min(int(b.epoch_length(epoch) / s) for b, s in zip(self.sources, self.share) if s > 0)


def source_corpora(data: DictConfig, log, required: Tokenizer | None = None
                   ) -> tuple[Tokenizer, list[Source]]:
    """The shared tokenizer and each source's documents. The tokenizer: ``required`` (a
    resumed run's, the main process's), else data.tokenizer, else the prepared sources'
    (which must agree), else a WordPiece tokenizer trained on every source's text,
    cached under the sources' fingerprint so the next run tokenizes nothing again."""
    names = source_names(data.sources)
    tokenizer = required or (load_tokenizer(data.tokenizer, data.lowercase) if data.tokenizer else None)
    prepared = {}
    for i, source in enumerate(data.sources):
        if source.prepared:
            own, docs = open_prepared(source.prepared, None, log)
            prepared[i] = docs
            if tokenizer is None:
                tokenizer, first = own, f"data.sources[{i}].prepared"
            elif tokenizer_sha256(own) != tokenizer_sha256(tokenizer):
                raise DataError(f"data.sources[{i}].prepared: {source.prepared} was prepared with "
                                f"another tokenizer than the run's; prepare every source with "
                                f"--tokenizer the same tokenizer.json")
    if tokenizer is None:
        fingerprint = ":".join(f"{corpus_fingerprint(s.corpus)}/{s.text_field or data.text_field}"
                               for s in data.sources)
        key = hashlib.sha256(f"sources:{fingerprint}:{data.vocab_size}:{data.lowercase}"
                             .encode()).hexdigest()[:20]
        cached = Path(os.path.expanduser(data.cache_dir)) / key / "tokenizer.json"
        if cached.is_file():
            tokenizer = Tokenizer.from_file(str(cached))
        else:
            texts = (sentence for s in data.sources
                     for doc in read_corpus(s.corpus, s.text_field or data.text_field)
                     for sentence in doc.sentences)
            tokenizer = train_tokenizer(texts, data, f"the {len(data.sources)} sources", log)
            try:
                cached.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_text(cached, tokenizer.to_str())
            except OSError:
                pass  # a cache we cannot write only costs time
    sources = []
    for i, (source, name) in enumerate(zip(data.sources, names)):
        if i in prepared:
            docs = prepared[i]
        else:
            own = OmegaConf.merge(data, {"corpus": source.corpus, "prepared": None, "sources": [],
                                         "text_field": source.text_field or data.text_field})
            _, docs = tokenized_corpus(own, log=log, tokenizer=tokenizer)
        sources.append(Source(name, source.weight, docs))
    return tokenizer, sources
