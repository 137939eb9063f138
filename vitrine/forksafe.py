"""A thread pool that survives ``fork()``: started on first use, started afresh in a forked child.

A forked child inherits the pool object but none of its worker threads (and maybe a lock another
thread held at the fork): work submitted there would queue forever. Ingest and Kafka workers and
``serve --workers`` fork, so every process-wide pool is one of these.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor


class ForkSafePool:
    """``pool.get()``: this process's executor (``max_workers`` threads named ``name``)."""

    def __init__(self, max_workers: int, name: str) -> None:
        self.max_workers = max(1, int(max_workers))
        self.name = name
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self._pool, self._lock = None, threading.Lock()

    def get(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.max_workers, thread_name_prefix=self.name)
            return self._pool
