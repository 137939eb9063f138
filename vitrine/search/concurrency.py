"""Readers and writers of the index state (vitrine/search/state.py).

Searches read several structures in turn (vector indexes, filter index, graph, record store);
a write changes all of them. :class:`StateLock` lets any number of searches run together and
makes each write's visible step (the SQLite commit and the in-memory index updates, or a hot
swap of models and indexes) exclusive, so a search never sees half a write: a product's record,
vectors, filters and graph node always agree, and a hot swap is all-or-nothing.

Writers are preferred (a waiting writer holds back new readers, so a busy read load cannot
starve ingest), and a thread that already reads may read again (a search that resolves a
comparison by searching), so nesting never deadlocks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class StateLock:
    """A writer-preferring readers-writer lock with re-entrant reads (per thread)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer: int | None = None
        self._writer_depth = 0
        self._waiting_writers = 0
        self._local = threading.local()
        self.write_wait_s = 0.0  # total time writers waited for readers (observability)
        self.writes = 0

    @contextmanager
    def read(self) -> Iterator[None]:
        me = threading.get_ident()
        depth = getattr(self._local, "depth", 0)
        if depth or self._writer == me:  # nested read, or a writer reading its own state
            self._local.depth = depth + 1
            try:
                yield
            finally:
                self._local.depth = depth
            return
        with self._cond:
            while self._writer is not None or self._waiting_writers:
                self._cond.wait()
            self._readers += 1
        self._local.depth = 1
        try:
            yield
        finally:
            self._local.depth = 0
            with self._cond:
                self._readers -= 1
                if self._readers == 0:
                    self._cond.notify_all()

    @contextmanager
    def write(self) -> Iterator[None]:
        me = threading.get_ident()
        if self._writer == me:  # re-entrant write
            self._writer_depth += 1
            try:
                yield
            finally:
                self._writer_depth -= 1
            return
        if getattr(self._local, "depth", 0):
            raise RuntimeError("a thread that reads the engine state cannot start a write (no upgrades)")
        t0 = time.perf_counter()
        with self._cond:
            self._waiting_writers += 1
            try:
                while self._writer is not None or self._readers:
                    self._cond.wait()
            finally:
                self._waiting_writers -= 1
            self._writer = me
        self.write_wait_s += time.perf_counter() - t0
        self.writes += 1
        try:
            yield
        finally:
            with self._cond:
                self._writer = None
                self._cond.notify_all()
