"""Keep a long-running server's heap from creeping up (glibc's malloc; a no-op elsewhere).

glibc serves allocations above a threshold with mmap and gives them back on free, but it raises
that threshold to the size of every mmapped block freed (up to 32 MiB). A server that writes
index snapshots (tens of MB of serialized FAISS index and graph JSON, every 30 s under writes)
soon has its threshold at 32 MiB, and from then on those buffers come from the heap, whose freed pages
fragment instead of going back: RSS climbs in steps at snapshot times. Measured with
``vitrine bench soak --duration 600`` on the full catalogue: without this, RSS went 1583 -> 2002 MB
(+62 MB/min in the first half, +17 in the second); with an 8 MiB threshold, 1527 -> 1611 MB,
+0.47 MB/min in the second half (bench-results/soak.md). A 1 MiB threshold held RSS too but cost
a third of the photo throughput at 16 clients (every batch's activations became fresh mmaps), and
capping arenas at 4 made 80 threads contend. A fixed threshold keeps big buffers on mmap; a trim
threshold returns the heap top sooner (``arenas`` can cap glibc's per-thread arenas; off by
default). The standard library has no binding for ``mallopt``; ctypes is the documented way.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys
from typing import Any

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8


def libc_function(name: str, argtypes: list[Any] | None = None, restype: Any = ctypes.c_int, *,
                  use_errno: bool = False) -> Any | None:
    """The C library's function ``name`` through ctypes (None off Linux, or when this libc lacks
    it: musl has no ``mallopt``). ``argtypes`` None leaves ctypes' default conversions (variadic
    functions such as ``prctl``)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=use_errno), name)
    except (OSError, AttributeError):
        return None
    if argtypes is not None:
        fn.argtypes = argtypes
    fn.restype = restype
    return fn


def limit_heap_growth(mmap_threshold: int = 8 << 20, trim_threshold: int = 16 << 20,
                      arenas: int | None = None) -> bool:
    """Set glibc's malloc thresholds for this process. Returns whether they took effect."""
    mallopt = libc_function("mallopt", [ctypes.c_int, ctypes.c_int])
    if mallopt is None:  # not Linux, or not glibc
        return False
    settings = [(M_MMAP_THRESHOLD, mmap_threshold), (M_TRIM_THRESHOLD, trim_threshold)]
    if arenas is not None:
        settings.append((M_ARENA_MAX, arenas))
    ok = all(mallopt(param, value) == 1 for param, value in settings)
    log.debug("malloc tuning %s", "applied" if ok else "refused")
    return ok


def trim_heap() -> bool:
    """Give the heap's free pages back to the system (glibc's ``malloc_trim``; after dropping
    large objects, before forking). Returns whether anything was released."""
    malloc_trim = libc_function("malloc_trim", [ctypes.c_size_t])
    return malloc_trim is not None and bool(malloc_trim(0))
