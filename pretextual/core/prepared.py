"""Reading a prepared corpus (the directory ``pretextual prepare`` writes, see
:mod:`pretextual.core.prepare`): its manifest, its tokenizer and its shards,
memory-mapped.

Every shard file's size and array header are checked each time it is opened, and
its sha256 once: a run verifies each file it has not verified before (a corruption
of the same size changes no header), records what it verified in ``verified.json``
beside the shards (by size and modification time), and reads only those files
again that changed since. A directory it cannot write to is verified on every run.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from pretextual.core.documents import Shard, TokenizedDocuments
from pretextual.core.files import atomic_write_text, sha256
from pretextual.core.tokenizer import (TOKENIZER_FILE, load_tokenizer, read_tokenizer,
                                       tokenizer_sha256, vocab_of)
from pretextual.errors import DataError

PREPARED_FORMAT = 1
MANIFEST, VERIFIED = "manifest.json", "verified.json"
AGAIN = "run pretextual prepare again to rebuild it"


def read_manifest(directory: Path) -> dict:
    """The manifest of a prepared corpus; DataError when ``directory`` is not one."""
    path = directory / MANIFEST
    if not directory.is_dir():
        raise DataError(f"data.prepared: no such directory: {directory}")
    if not path.is_file():
        raise DataError(f"data.prepared: {directory} has no {MANIFEST}: not a prepared corpus, or "
                        f"`pretextual prepare` did not finish there (run it again to resume)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as exc:
        raise DataError(f"{path}: not readable JSON ({exc})") from None
    if manifest.get("format") != PREPARED_FORMAT:
        raise DataError(f"{path}: format {manifest.get('format')!r}, this version reads "
                        f"{PREPARED_FORMAT}; run pretextual prepare again")
    return manifest


def _open_shard(directory: Path, entry: dict) -> Shard:
    """Memory-map one shard after checking its files against the manifest (size, length)."""
    paths = {field: directory / entry["files"][field]["file"] for field in Shard.FIELDS}
    for field, path in paths.items():
        expected = entry["files"][field]["bytes"]
        if not path.is_file():
            raise DataError(f"{path}: missing (listed in {MANIFEST}); {AGAIN}")
        if path.stat().st_size != expected:
            raise DataError(f"{path}: {path.stat().st_size} bytes where {MANIFEST} says "
                            f"{expected}: damaged; {AGAIN}")
    try:
        shard = Shard.map(paths)
    except (ValueError, OSError) as exc:
        raise DataError(f"{exc}; {AGAIN}") from None
    lengths = {"ids": entry["tokens"], "word_starts": entry["tokens"],
               "sentence_offsets": entry["sentences"] + 1, "document_offsets": entry["documents"] + 1}
    for field, length in lengths.items():
        if len(getattr(shard, field)) != length:
            raise DataError(f"{paths[field]}: holds {len(getattr(shard, field))} values where "
                            f"{MANIFEST} says {length}; {AGAIN}")
    return shard


def _stamp(path: Path) -> list[int]:
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns]


def verify_shards(directory: Path, manifest: dict, shards: list[Shard], vocab_size: int,
                  tokenizer_file: Path, log=print) -> None:
    """Check the sha256 of every shard file not verified before (see the module
    docstring), and that every token id is inside the vocabulary; DataError naming the
    file otherwise."""
    record_file = directory / VERIFIED
    try:
        record = json.loads(record_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # none yet, or unreadable: verify everything
        record = {}
    record = record if isinstance(record, dict) else {}
    started, checked, checked_bytes = time.perf_counter(), 0, 0
    for entry, shard in zip(manifest["shards"], shards):
        for field in Shard.FIELDS:
            listed = entry["files"][field]
            path, name = directory / listed["file"], listed["file"]
            if record.get(name) == [*_stamp(path), listed["sha256"]]:
                continue
            if sha256(path) != listed["sha256"]:
                raise DataError(f"{path}: its sha256 differs from {MANIFEST}'s: damaged; {AGAIN}")
            if field == "ids" and len(shard.ids):
                largest = int(np.max(shard.ids))
                if largest >= vocab_size:
                    raise DataError(f"{path}: token id {largest} is outside the vocabulary of "
                                    f"{tokenizer_file} ({vocab_size} ids); {AGAIN}")
            record[name] = [*_stamp(path), listed["sha256"]]
            checked, checked_bytes = checked + 1, checked_bytes + listed["bytes"]
    if not checked:
        return
    log(f"data.prepared: verified the sha256 of {checked} shard files ({checked_bytes / 2**20:,.1f} "
        f"MB) in {time.perf_counter() - started:.1f} s")
    try:
        atomic_write_text(record_file, json.dumps(record, indent=0))
    except OSError:  # read-only storage: the next run verifies again
        log(f"data.prepared: cannot write {record_file}; the next run verifies the shards again")


def open_prepared(directory: str | Path, tokenizer: str | None = None, log=print,
                  lowercase: bool = True) -> tuple[Tokenizer, TokenizedDocuments]:
    """The tokenizer and memory-mapped documents of a prepared corpus, every file checked
    against the manifest (see the module docstring); ``tokenizer`` (data.tokenizer, read
    with data.lowercase) must be the one it was prepared with."""
    directory = Path(directory).expanduser()
    manifest = read_manifest(directory)
    tokenizer_file = directory / TOKENIZER_FILE
    if not tokenizer_file.is_file():
        raise DataError(f"{tokenizer_file}: missing (listed in {MANIFEST}); run pretextual "
                        f"prepare again")
    prepared = read_tokenizer(tokenizer_file)
    if tokenizer_sha256(prepared) != manifest["tokenizer_sha256"]:
        raise DataError(f"{tokenizer_file}: changed since prepare (its sha256 differs from "
                        f"{MANIFEST}); run pretextual prepare again")
    vocab_of(prepared, str(tokenizer_file))
    if tokenizer and load_tokenizer(tokenizer, lowercase).to_str() != prepared.to_str():
        raise DataError(f"data.tokenizer: {tokenizer} is not the tokenizer {directory} was "
                        f"prepared with ({tokenizer_file}); unset data.tokenizer")
    shards = [_open_shard(directory, entry) for entry in manifest["shards"]]
    verify_shards(directory, manifest, shards, prepared.get_vocab_size(), tokenizer_file, log)
    log(f"data.prepared: {manifest['documents']:,} documents, {manifest['tokens']:,} tokens in "
        f"{len(shards)} shards of {directory}")
    return prepared, TokenizedDocuments.from_shards(shards)
