"""Writing files so that a crash or a full disk never leaves a half-written one behind."""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path next to ``path`` to write to: when the block ends without an
    error the file is flushed to disk and renamed over ``path``; otherwise (or when
    that fails) it is removed and ``path`` is untouched."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
