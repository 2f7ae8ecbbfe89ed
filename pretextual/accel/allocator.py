"""glibc's malloc told to keep freed memory for reuse, for a training process on the CPU."""

from __future__ import annotations

import ctypes

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
_KEEP_BYTES = 1 << 30


def keep_freed_memory() -> bool:
    """Make glibc's malloc serve blocks up to 1 GiB from its heap and keep freed memory
    for reuse (process-wide). By default blocks above 32 MiB are mapped and unmapped on
    every allocation and freed heap tops are returned to the system, so each training
    step page-faults its large activations and gradients in afresh. The process's peak
    memory stays the same. Returns False where the C library is not glibc."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS, Windows)
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, _KEEP_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD, _KEEP_BYTES))
