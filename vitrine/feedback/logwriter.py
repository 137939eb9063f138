"""Search logging off the request thread (issue 53, "search never waits for side work").

:class:`BatchedSearchLog` wraps a feedback log (SQLite or PostgreSQL): ``log_search`` only queues
the search and returns; one background thread writes what queued in batches (``log_searches``: one
transaction per batch), so a search never waits on the log's connection, its lock or its disk.
Whatever reads the log first waits for what queued before it to be written (any other method of the
log flushes first), so an event posted right after its search, an analytics report or a learn
always sees the searches logged before it. Closing writes what is left.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any

from vitrine.errors import VitrineError
from vitrine.feedback.types import EventLogAPI, SearchLog

log = logging.getLogger(__name__)

MAX_BATCH = 500


class BatchedSearchLog:
    """``inner`` with its searches written by a background thread, in batches of at most ``max_batch``."""

    # attributes read on the request thread (or cheap and state-free): never wait for the queue. The
    # experiments' specs and teams are among them: every search checks the running experiment once a
    # second, and a flush there waited for the queued searches' write, itself behind the events'
    # durable commits for the file's write lock (p99 under an events flood).
    _DIRECT = frozenset({"hash_user", "log_search", "path", "target", "close", "flush", "counts_cached",
                         "check_writable", "experiment_specs", "log_teams"})

    def __init__(self, inner: EventLogAPI, *, max_batch: int = MAX_BATCH) -> None:
        self._inner = inner
        self._max_batch = max_batch
        self._queue: deque[SearchLog] = deque()
        self._pending = 0  # queued and not yet written (or given up on)
        self._closed = False
        self._cv = threading.Condition()
        self.written = 0
        self.batches = 0
        self._thread = threading.Thread(target=self._run, name="vitrine-search-log", daemon=True)
        self._thread.start()

    @property
    def inner(self) -> EventLogAPI:
        return self._inner

    def log_search(self, s: SearchLog) -> None:
        self._inner.check_writable()  # the database is known to be down: unlogged now, not lost later
        if not self._thread.is_alive():  # the writer died: write here rather than queue forever
            self._inner.log_search(s)
            return
        with self._cv:
            if self._closed:
                raise VitrineError("the search log is closed")
            self._queue.append(s)
            self._pending += 1
            self._cv.notify_all()

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until every search queued so far is written."""
        with self._cv:
            if self._pending:
                self._cv.wait_for(lambda: not self._pending or not self._thread.is_alive(), timeout_s)

    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: bool(self._queue) or self._closed)
                if not self._queue:
                    return
                batch = [self._queue.popleft() for _ in range(min(len(self._queue), self._max_batch))]
            try:
                self._inner.log_searches(batch)
            except (VitrineError, OSError) as e:  # the writer outlives one bad batch
                log.error("%d searches not logged: %s", len(batch), e)
            except BaseException:
                with self._cv:
                    self._pending -= len(batch)
                    self._cv.notify_all()
                log.exception("the search log writer stopped: searches are logged on the request thread")
                raise
            with self._cv:
                self._pending -= len(batch)
                self.written += len(batch)
                self.batches += 1
                self._cv.notify_all()

    def close(self) -> None:
        self.flush()
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(30.0)
        self._inner.close()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if callable(attr) and name not in self._DIRECT:
            self.flush()  # a read sees every search logged before it
        return attr
