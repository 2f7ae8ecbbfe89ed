"""Corpus -> tokenizer + tokenized documents.

Two ways. ``tokenized_corpus`` reads a corpus that fits in memory, tokenizes it
and caches the result (safetensors under data.cache_dir), so a second run does
not tokenize again. For corpora larger than memory, ``pretextual prepare CORPUS
--out DIR`` (``prepare_corpus``) tokenizes once, in parallel processes, into
shards of .npy arrays that training memory-maps (``data.prepared=DIR``):

* ``tokenizer.json``: the tokenizer (data.tokenizer, or WordPiece trained on
  the first ``sample_mb`` MB of the corpus);
* ``shard-NNNNN.{ids,word_starts,sentence_offsets,document_offsets}.npy``: one
  chunk of the corpus each (a file, several small files, or a byte range of a
  large file cut at a blank line); ids are uint16 when the vocabulary allows;
* ``shard-NNNNN.json``: what the shard was made from, its counts and the sha256
  of each file, written when the shard is complete;
* ``manifest.json``: every shard's counts and checksums, written last and
  atomically. Without it the directory is not a prepared corpus, so a
  half-written prepare never looks complete; running prepare again keeps every
  shard whose files verify and tokenizes only the rest.

Training reads the directory through :mod:`pretextual.core.prepared`.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from functools import partial
from pathlib import Path
from typing import Iterator

import numpy as np
import tokenizers
from safetensors import SafetensorError
from tokenizers import Tokenizer

from pretextual.core import formats
from pretextual.core.corpus import (EMBEDDED, Document, corpus_files, corpus_fingerprint,
                                    document_boundary, embedded_corpus, iter_documents, read_corpus)
from pretextual.core.documents import Shard, TokenizedDocuments
from pretextual.core.files import atomic_path, atomic_write_text, sha256, write_error_reason
from pretextual.core.prepared import MANIFEST, PREPARED_FORMAT, open_prepared
from pretextual.core.tokenizer import TOKENIZER_FILE, load_tokenizer, tokenizer_sha256, train_wordpiece
from pretextual.errors import DataError

CACHE_FORMAT = 1
TOKENIZER_RECIPE = "tokenizer.recipe.json"
ENCODE_BATCH_BYTES = 1 << 20  # text per encode_batch call in a worker: bounds its memory
MB = 1 << 20


# --- in memory, cached ----------------------------------------------------------------------

def _cache_key(data_cfg, given: Tokenizer | None = None) -> str:
    # A tokenizer handed in (a resumed run's, model.init_from's, a mix's shared one) has a
    # cache entry of its own: it must never replace the entry of the one data.* would train.
    if given is not None:
        tokenizer = f"given:{tokenizer_sha256(given)}"
    elif data_cfg.tokenizer:
        tokenizer = load_tokenizer(data_cfg.tokenizer, data_cfg.lowercase).to_str()
    else:
        tokenizer = f"wordpiece:{data_cfg.vocab_size}:{data_cfg.lowercase}"
    return sha256(f"v{CACHE_FORMAT}:{corpus_fingerprint(data_cfg.corpus)}:{data_cfg.text_field}"
                  f"{tokenizer}".encode())[:20]


def _write_error(path: Path, exc: OSError) -> DataError:
    """The error of a failed write during prepare (a full disk): what is kept, what to do."""
    return DataError(f"{path}: cannot write ({write_error_reason(exc)}); the shards written so far "
                     f"are kept, run prepare again to resume")


def tokenized_corpus(data_cfg, log=print, tokenizer: Tokenizer | None = None,
                     documents: list[Document] | None = None
                     ) -> tuple[Tokenizer, TokenizedDocuments]:
    """The run's tokenizer and tokenized documents: memory-mapped from data.prepared
    when it is set, else from the cache when present, else read and tokenized.
    ``tokenizer``: the one the text must be tokenized with (a resumed run's, the main
    process's), instead of data.tokenizer or a trained one; the cache serves only when it
    holds that one. data.prepared comes with its own tokenizer, returned as it is.
    ``documents``: tokenize these instead of any corpus (no cache: they have no file)."""
    if documents is not None:
        return _tokenize(documents, data_cfg, tokenizer, f"{len(documents)} documents", log)
    if data_cfg.prepared:
        return open_prepared(data_cfg.prepared, data_cfg.tokenizer, log, data_cfg.lowercase)
    cache = Path(os.path.expanduser(data_cfg.cache_dir)) / _cache_key(data_cfg, tokenizer)
    tokenizer_file, tokens_file = cache / "tokenizer.json", cache / "tokens.safetensors"
    if tokenizer_file.is_file() and tokens_file.is_file():
        try:
            cached = Tokenizer.from_file(str(tokenizer_file))
            if tokenizer is None or cached.to_str() == tokenizer.to_str():
                return cached, TokenizedDocuments.load(tokens_file)
        except Exception as exc:  # a damaged cache is rebuilt, never trusted
            print(f"pretextual: warning: rebuilding damaged cache {cache}: {exc}", file=sys.stderr)
    docs = read_corpus(data_cfg.corpus, data_cfg.text_field)
    tokenizer, tokenized = _tokenize(docs, data_cfg, tokenizer, f"data.corpus: {data_cfg.corpus}",
                                     log)
    try:
        cache.mkdir(parents=True, exist_ok=True)
        tokenized.save(tokens_file)
        atomic_write_text(tokenizer_file, tokenizer.to_str())
    except (OSError, SafetensorError) as exc:  # a cache we cannot write only costs time
        print(f"pretextual: warning: cannot write cache {cache} ({write_error_reason(exc)}); the "
              f"corpus is tokenized again next time", file=sys.stderr)
    return tokenizer, tokenized


# --- prepared shards: writing ---------------------------------------------------------------

def _plan(corpus: str, shard_bytes: int) -> list[list[list]]:
    """The corpus cut into chunks of about ``shard_bytes``: each a list of pieces
    ``[path, start, end, file size, mtime_ns]``. A large text file is cut at document
    boundaries (a compressed or Parquet/Arrow file is read whole by one worker); small
    files share a chunk; empty files are left out."""
    if corpus == EMBEDDED:
        return [[[EMBEDDED, 0, 0, 0, 0]]]
    chunks, current, filled = [], [], 0
    for path in corpus_files(corpus):
        stat = path.stat()
        start = 0
        whole = formats.file_format(path) is not formats.TEXT  # compressed or a table
        while start < stat.st_size:
            end = (stat.st_size if whole or stat.st_size - start <= shard_bytes
                   else document_boundary(path, start + shard_bytes))
            if current and filled + end - start > shard_bytes:
                chunks.append(current)
                current, filled = [], 0
            current.append([str(path.resolve()), start, end, stat.st_size, stat.st_mtime_ns])
            filled += end - start
            start = end
    return chunks + [current] if current else chunks


def _sample_sentences(corpus: str, text_field: str, limit: int) -> Iterator[str]:
    """Sentences from the start of the corpus, until ``limit`` characters."""
    seen = 0
    documents = (embedded_corpus() if corpus == EMBEDDED else
                 (d for path in corpus_files(corpus) for d in iter_documents(path, text_field)))
    for doc in documents:
        for sentence in doc.sentences:
            yield sentence
            seen += len(sentence)
        if seen >= limit:
            return


def _prepared_tokenizer(out: Path, corpus: str, data_cfg, sample_bytes: int, log) -> Tokenizer:
    """data.tokenizer, or a WordPiece tokenizer trained on a sample; kept in ``out`` and
    reused by a re-run with the same recipe (training again could break ties differently)."""
    if data_cfg.tokenizer:
        given = load_tokenizer(data_cfg.tokenizer, data_cfg.lowercase)
        recipe = {"file": tokenizer_sha256(given)}
    else:
        recipe = {"wordpiece": data_cfg.vocab_size, "lowercase": data_cfg.lowercase,
                  "sample_bytes": sample_bytes, "corpus": corpus_fingerprint(corpus),
                  "text_field": data_cfg.text_field}
    recipe_file, tokenizer_file = out / TOKENIZER_RECIPE, out / TOKENIZER_FILE
    try:
        kept = json.loads(recipe_file.read_text())
        if kept == {**recipe, "sha256": sha256(tokenizer_file)}:
            return Tokenizer.from_file(str(tokenizer_file))
    except Exception:  # no tokenizer yet, or one made otherwise or changed since: make it
        pass
    if data_cfg.tokenizer:
        tokenizer = given
    else:
        log(f"note: WordPiece training (tokenizers {tokenizers.__version__}) breaks ties between "
            f"equally frequent pieces in an order that changes from run to run, so a prepare into "
            f"another directory can give another tokenizer.json; for the same one, pass "
            f"--tokenizer {tokenizer_file}")
        tokenizer = train_tokenizer(_sample_sentences(corpus, data_cfg.text_field, sample_bytes),
                                     data_cfg, f"the first {sample_bytes / MB:.3g} MB of {corpus}", log)
    text = tokenizer.to_str()
    recipe["sha256"] = sha256(text.encode())
    _write_outputs({tokenizer_file: text, recipe_file: json.dumps(recipe)})
    return tokenizer


def _tokenize(docs: list[Document], data_cfg, tokenizer: Tokenizer | None, what: str, log
              ) -> tuple[Tokenizer, TokenizedDocuments]:
    """``docs`` tokenized with ``tokenizer``, else data.tokenizer, else a WordPiece
    tokenizer trained on them; ``what`` names them in the error for no tokens."""
    if tokenizer is None and data_cfg.tokenizer:
        tokenizer = load_tokenizer(data_cfg.tokenizer, data_cfg.lowercase)
    elif tokenizer is None:
        tokenizer = train_tokenizer((s for d in docs for s in d.sentences), data_cfg,
                                    f"{len(docs)} documents", log)
    tokenized = TokenizedDocuments.from_documents(docs, tokenizer)
    if len(tokenized.ids) == 0:
        raise DataError(f"{what} gives no tokens")
    return tokenizer, tokenized


def train_tokenizer(sentences, data_cfg, what: str, log):
    """A WordPiece tokenizer of data.vocab_size trained on ``sentences``; a note when the
    text gives another size (fewer pieces than asked, or more: its characters alone)."""
    log(f"training a WordPiece tokenizer (vocab {data_cfg.vocab_size}) on {what}")
    tokenizer = train_wordpiece(sentences, data_cfg.vocab_size, data_cfg.lowercase)
    size = tokenizer.get_vocab_size()
    if size != data_cfg.vocab_size:
        why = ("the text holds no more distinct pieces" if size < data_cfg.vocab_size
               else "every character of the text is a piece")
        log(f"note: the tokenizer has {size:,} pieces, not data.vocab_size={data_cfg.vocab_size:,}: {why}")
    return tokenizer


def _write_outputs(texts: dict[Path, str]) -> None:
    """Write text files atomically; a failure (a full disk) is a DataError naming the file."""
    for path, text in texts.items():
        try:
            atomic_write_text(path, text)
        except OSError as exc:
            raise _write_error(path, exc) from None


def _document_batches(pieces: list[list], text_field: str) -> Iterator[tuple[list[Document], int]]:
    """The documents of a chunk in batches of about ENCODE_BATCH_BYTES, with their UTF-8 size."""
    batch, size = [], 0
    for path, start, end, _, _ in pieces:
        documents = embedded_corpus() if path == EMBEDDED else iter_documents(path, text_field,
                                                                                start, end)
        for doc in documents:
            batch.append(doc)
            size += sum(len(s.encode("utf-8")) for s in doc.sentences)
            if size >= ENCODE_BATCH_BYTES:
                yield batch, size
                batch, size = [], 0
    if batch:
        yield batch, size


def _concatenate(parts: list[Shard], ids_dtype: str) -> dict[str, np.ndarray]:
    """One shard's arrays from the arrays of its batches (offsets shifted to match)."""
    tokens = np.cumsum([0] + [len(p.ids) for p in parts])
    sentences = np.cumsum([0] + [len(p.sentence_offsets) - 1 for p in parts])
    return {
        "ids": np.concatenate([np.zeros(0, ids_dtype)] + [p.ids.astype(ids_dtype) for p in parts]),
        "word_starts": np.concatenate([np.zeros(0, np.uint8)] + [p.word_starts for p in parts]),
        "sentence_offsets": np.concatenate(
            [np.zeros(1, np.int64)] + [p.sentence_offsets[1:] + t for p, t in zip(parts, tokens)]),
        "document_offsets": np.concatenate(
            [np.zeros(1, np.int64)] + [p.document_offsets[1:] + s for p, s in zip(parts, sentences)]),
    }


class _Writes:
    """A file that numpy writes through ``write`` in chunks: its fast path (C's fwrite)
    reports a full disk as "N requested and M written", without the system's reason."""

    def __init__(self, file):
        self.write = file.write


def _save_npy(out: Path, name: str, array: np.ndarray) -> dict:
    """Write one .npy atomically; its entry for the manifest (file, bytes, sha256)."""
    try:
        with atomic_path(out / name) as tmp:
            with open(tmp, "wb") as f:
                np.save(_Writes(f), array, allow_pickle=False)
            entry = {"file": name, "bytes": tmp.stat().st_size, "sha256": sha256(tmp)}
    except OSError as exc:
        raise _write_error(out / name, exc) from None
    return entry


def _prepare_shard(out: Path, job: dict) -> dict:
    """Tokenize one chunk into its shard files, then its sidecar; returns the sidecar.
    Runs in a worker process: everything else it needs is in ``job``."""
    tokenizer = Tokenizer.from_file(str(out / TOKENIZER_FILE))
    parts, text_bytes = [], 0
    for batch, size in _document_batches(job["pieces"], job["text_field"]):
        parts.append(TokenizedDocuments.from_documents(batch, tokenizer).shards[0])
        text_bytes += size
    arrays = _concatenate(parts, job["ids_dtype"])
    files = {field: _save_npy(out, f"{job['name']}.{field}.npy", array)
             for field, array in arrays.items()}
    sidecar = {"job": job, "name": job["name"], "sources": [p[:3] for p in job["pieces"]],
               "documents": len(arrays["document_offsets"]) - 1,
               "sentences": len(arrays["sentence_offsets"]) - 1,
               "tokens": len(arrays["ids"]), "text_bytes": text_bytes, "files": files}
    _write_outputs({out / f"{job['name']}.json": json.dumps(sidecar, indent=1)})
    return sidecar


def _finished_shard(out: Path, job: dict) -> dict | None:
    """The sidecar of a shard a previous run completed for this same job, if its files verify."""
    try:
        sidecar = json.loads((out / f"{job['name']}.json").read_text())
        if sidecar["job"] == job and all(sha256(out / f["file"]) == f["sha256"]
                                         for f in sidecar["files"].values()):
            return sidecar
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def _start_fresh(out: Path, names: set[str]) -> None:
    """Remove the manifest (until this run writes it again), temporary files of an
    interrupted run, and shards that the current plan no longer has."""
    (out / MANIFEST).unlink(missing_ok=True)
    for path in out.iterdir():
        stale = path.name.startswith("shard-") and path.name.split(".")[0] not in names
        if stale or (path.name.startswith(".") and path.name.endswith(".tmp")):
            path.unlink()


def _worker_setup() -> None:
    # Parallelism comes from the processes; a tokenizers thread pool in each would oversubscribe.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"


def _run_jobs(out: Path, jobs: list[dict], workers: int, log) -> list[dict]:
    """Run the shard jobs in ``workers`` processes (here when one), logging each as it ends.
    On the first failure the jobs not yet started are cancelled; finished shards stay."""
    if workers <= 1:
        results = map(partial(_prepare_shard, out), jobs)
        return [_log_shard(s, i, len(jobs), log) for i, s in enumerate(results, 1)]
    # spawn: a clean interpreter, safe whatever threads this process has started; an
    # executor, not a Pool, so a worker that dies is an error instead of a hang.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_worker_setup) as executor:
        futures = [executor.submit(_prepare_shard, out, job) for job in jobs]
        try:
            return [_log_shard(f.result(), i, len(jobs), log)
                    for i, f in enumerate(as_completed(futures), 1)]
        except BaseException:
            for future in futures:
                future.cancel()
            raise


def _log_shard(sidecar: dict, done: int, total: int, log) -> dict:
    log(f"{sidecar['name']}: {sidecar['documents']:,} documents, {sidecar['tokens']:,} tokens "
        f"({done}/{total})")
    return sidecar


def _default_workers() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def prepare_corpus(corpus: str, out: str | Path, data_cfg, workers: int | None = None,
                   shard_mb: float = 16, sample_mb: float = 16, log=print) -> dict:
    """Tokenize ``corpus`` into memory-mapped shards in ``out`` (see the module
    docstring), reusing the shards of an earlier, interrupted run; returns the manifest.

    ``data_cfg`` supplies text_field and the tokenizer (data.tokenizer, or
    vocab_size and lowercase for one trained on the first ``sample_mb`` MB).
    """
    out = Path(out).expanduser()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"{out}: cannot create the output directory ({exc.strerror})") from None
    chunks = _plan(corpus, max(1, int(shard_mb * MB)))
    names = [f"shard-{i:05d}" for i in range(len(chunks))]
    _start_fresh(out, set(names))
    tokenizer = _prepared_tokenizer(out, corpus, data_cfg, int(sample_mb * MB), log)
    ids_dtype = "uint16" if tokenizer.get_vocab_size() <= 1 << 16 else "int32"
    tokenizer_digest = tokenizer_sha256(tokenizer)
    jobs = [{"format": PREPARED_FORMAT, "name": name, "pieces": pieces, "ids_dtype": ids_dtype,
             "text_field": data_cfg.text_field, "tokenizer_sha256": tokenizer_digest}
            for name, pieces in zip(names, chunks)]
    finished = {job["name"]: _finished_shard(out, job) for job in jobs}
    pending = [job for job in jobs if finished[job["name"]] is None]
    if len(pending) < len(jobs):
        log(f"{len(jobs) - len(pending)} of {len(jobs)} shards already prepared in {out}; "
            f"tokenizing the other {len(pending)}")
    for sidecar in _run_jobs(out, pending, min(workers or _default_workers(), len(pending)), log):
        finished[sidecar["name"]] = sidecar
    manifest = _manifest(corpus, data_cfg, tokenizer, tokenizer_digest,
                         [finished[job["name"]] for job in jobs])
    if manifest["documents"] == 0:
        raise DataError(f"data.corpus: {corpus} holds no text")
    if manifest["tokens"] == 0:
        raise DataError(f"data.corpus: {corpus} gives no tokens")
    _write_outputs({out / MANIFEST: json.dumps(manifest, indent=1)})
    log(f"prepared {manifest['documents']:,} documents, {manifest['sentences']:,} sentences, "
        f"{manifest['tokens']:,} tokens in {len(jobs)} shards in {out}; "
        f"train with data.prepared={out}")
    return manifest


def _manifest(corpus: str, data_cfg, tokenizer: Tokenizer, tokenizer_digest: str,
              sidecars: list[dict]) -> dict:
    shards = [{k: v for k, v in s.items() if k != "job"} for s in sidecars]
    counts = {key: sum(s[key] for s in shards)
              for key in ("documents", "sentences", "tokens", "text_bytes")}
    return {"format": PREPARED_FORMAT, "corpus": corpus, "text_field": data_cfg.text_field,
            "tokenizer": TOKENIZER_FILE, "tokenizer_sha256": tokenizer_digest,
            "vocab_size": tokenizer.get_vocab_size(), **counts, "shards": shards}
