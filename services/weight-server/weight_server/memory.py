"""The weight-server's memory under reads (issue 31 item 6: 69 -> 209 MB under valid compacted-delta reads).

What grew it: compacted deltas composed on many of uvicorn's threads at once (each thread its own malloc arena,
each build's chain and result alive together), and freed memory glibc kept. Now the store builds one compacted
delta at a time (store.VersionStore's build lock), glibc keeps at most `ARENAS` arenas, and freed memory is given
back to the OS after each build (`trim`). What is left is the delta codec's one-time import (numpy, numba) on the
first compacted delta. Figures: bench/weight_server_memory_bench.py, docs/benchmarks.md.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

ARENAS = 2
_M_ARENA_MAX = -8  # glibc's mallopt parameter


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None  # glibc only (not musl)


_LIBC = _libc()


def bound_arenas(arenas: int = ARENAS) -> None:
    """At start, before the threads: glibc keeps at most `arenas` malloc arenas (default: 8 per core)."""
    if _LIBC is not None and not _LIBC.mallopt(_M_ARENA_MAX, arenas):
        log.warning("could not bound malloc arenas", extra={"arenas": arenas})


def trim() -> None:
    """Give freed heap memory back to the OS (a no-op without glibc)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
