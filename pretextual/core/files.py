"""Files on disk: writing so that a crash or a full disk never leaves a half-written file
or directory behind, and the sha256 that checksums and keys are made of."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

TEMPORARY_PREFIX = ".tmp-"
"""How the temporary directory of an :func:`atomic_directory` is named (then the target's name)."""


def sha256(data: bytes | Path) -> str:
    """The hex sha256 of ``data``: bytes as given, or a file's contents, read in blocks."""
    if isinstance(data, bytes):
        return hashlib.sha256(data).hexdigest()
    h = hashlib.sha256()
    with open(data, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_error_reason(exc: BaseException) -> str:
    """Why a write failed, in the system's words ("No space left on device"): an OSError's
    strerror (its message when it has none), or the OS error a safetensors error carries."""
    text = " ".join(str(exc).split())
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    found = re.search(r"I/O error: (.*?) \(os error \d+\)", text)
    return found.group(1) if found else text or type(exc).__name__


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path next to ``path`` to write to: when the block ends without an
    error the file is flushed to disk and renamed over ``path``; otherwise (or when
    that fails) it is removed and ``path`` is untouched."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        _fsync(Path(tmp))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through :func:`atomic_path`."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


@contextmanager
def atomic_directory(path: Path) -> Iterator[Path]:
    """A temporary directory next to ``path`` to fill: when the block ends without an
    error its files are flushed to disk and it is renamed to ``path``, an existing
    ``path`` being removed only once the new one is in place; otherwise (or when that
    fails) it is removed and ``path`` is untouched. ``path``'s parent must exist.

    A process killed inside the block leaves a directory named
    ``TEMPORARY_PREFIX + path.name + "-..."`` next to ``path``, for its owner to remove."""
    prefix = f"{TEMPORARY_PREFIX}{path.name}-"
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=path.parent))
    try:
        yield tmp
        for file in tmp.rglob("*"):
            if file.is_file():
                _fsync(file)
        if not path.exists():
            os.replace(tmp, path)
            return
        old = Path(tempfile.mkdtemp(prefix=prefix, dir=path.parent))
        os.replace(path, old / path.name)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _fsync(file: Path) -> None:
    with open(file, "rb") as f:
        os.fsync(f.fileno())
