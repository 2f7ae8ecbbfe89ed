"""Corpus -> tokenizer + tokenized documents, cached so a second run does not tokenize again."""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from pathlib import Path

from tokenizers import Tokenizer

from pretextual.core.corpus import corpus_fingerprint, read_corpus
from pretextual.core.data import TokenizedDocuments
from pretextual.core.tokenizer import load_tokenizer, train_wordpiece
from pretextual.errors import DataError

CACHE_FORMAT = 1


def _cache_key(data_cfg) -> str:
    h = hashlib.sha256(f"v{CACHE_FORMAT}:{corpus_fingerprint(data_cfg.corpus)}:"
                       f"{data_cfg.text_field}".encode())
    if data_cfg.tokenizer:
        h.update(load_tokenizer(data_cfg.tokenizer).to_str().encode())
    else:
        h.update(f"wordpiece:{data_cfg.vocab_size}:{data_cfg.lowercase}".encode())
    return h.hexdigest()[:20]


def _write_text_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def tokenized_corpus(data_cfg, log=print) -> tuple[Tokenizer, TokenizedDocuments]:
    """The run's tokenizer and tokenized documents, from the cache when present."""
    cache = Path(os.path.expanduser(data_cfg.cache_dir)) / _cache_key(data_cfg)
    tokenizer_file, tokens_file = cache / "tokenizer.json", cache / "tokens.safetensors"
    if tokenizer_file.is_file() and tokens_file.is_file():
        try:
            return Tokenizer.from_file(str(tokenizer_file)), TokenizedDocuments.load(tokens_file)
        except Exception as exc:  # a damaged cache is rebuilt, never trusted
            print(f"pretextual: warning: rebuilding damaged cache {cache}: {exc}", file=sys.stderr)
    docs = read_corpus(data_cfg.corpus, data_cfg.text_field)
    if data_cfg.tokenizer:
        tokenizer = load_tokenizer(data_cfg.tokenizer)
    else:
        log(f"training a WordPiece tokenizer (vocab {data_cfg.vocab_size}) on {len(docs)} documents")
        tokenizer = train_wordpiece((s for d in docs for s in d.sentences), data_cfg.vocab_size,
                                    data_cfg.lowercase)
    tokenized = TokenizedDocuments.from_documents(docs, tokenizer)
    if len(tokenized.ids) == 0:
        raise DataError(f"data.corpus: {data_cfg.corpus} gives no tokens")
    try:
        cache.mkdir(parents=True, exist_ok=True)
        tokenized.save(tokens_file)
        _write_text_atomic(tokenizer_file, tokenizer.to_str())
    except OSError as exc:  # a cache we cannot write only costs time
        print(f"pretextual: warning: cannot write cache {cache}: {exc}", file=sys.stderr)
    return tokenizer, tokenized
