"""Building blocks of the query fast path: a dynamic micro-batcher, its LRU cache (:mod:`vitrine.lru`)
and the keyed requests in flight (:class:`InFlight`: concurrent asks for one query share its encode).

``MicroBatcher`` turns many concurrent single-item calls into a few batched ones. Callers
``submit`` an item and wait on a future; one worker thread takes the first queued item, then
keeps collecting until ``max_batch`` items or ``max_wait_s`` after the first one, runs the
batch function once over all of them and resolves every future. Under load, requests that
arrive while a batch is running queue up and go together in the next one, so a model forward
is paid once per batch instead of once per request. An exception raised by the batch function
fails every future of that batch (it never kills the worker).
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, Generic, TypeVar

from vitrine.lru import LRU

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


# The query-embedding cache is the one LRU every layer uses.
LRUCache = LRU


class _Closed:
    pass


_CLOSE = _Closed()


_live_batchers: "weakref.WeakSet[MicroBatcher[Any, Any]]" = weakref.WeakSet()


def _reset_after_fork() -> None:
    """In a forked child only the forking thread survives: every batcher's worker thread is gone
    (its queue and locks may be mid-use). Each starts afresh on its next submit."""
    for b in list(_live_batchers):
        b._forget_worker()


os.register_at_fork(after_in_child=_reset_after_fork)


class MicroBatcher(Generic[T, R]):
    """Collects concurrent ``submit(item)`` calls into batches for ``fn(items) -> results``.

    ``fn`` must return one result per item, in order. ``on_start`` runs once in the worker
    thread before its first batch (e.g. to set torch's per-thread thread count). Safe across
    ``fork()``: a child starts its own worker thread on its first submit.
    """

    def __init__(
        self,
        fn: Callable[[list[T]], Sequence[R]],
        *,
        max_batch: int = 32,
        max_wait_s: float = 0.002,
        name: str = "vitrine-batcher",
        on_start: Callable[[], None] | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        if max_wait_s < 0:
            raise ValueError("max_wait_s must be >= 0")
        self.fn = fn
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.name = name
        self._on_start = on_start
        self._q: queue.SimpleQueue[tuple[T, Future[R]] | _Closed] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._closed = False
        self.batches = 0
        self.items = 0
        self.largest = 0
        _live_batchers.add(self)

    def _forget_worker(self) -> None:
        self._q = queue.SimpleQueue()
        self._thread = None
        self._start_lock = threading.Lock()

    # -- callers ---------------------------------------------------------------------------
    def submit(self, item: T) -> Future[R]:
        if self._closed:
            raise RuntimeError(f"{self.name} is closed")
        self._ensure_started()
        fut: Future[R] = Future()
        self._q.put((item, fut))
        return fut

    def __call__(self, item: T, timeout: float | None = None) -> R:
        """Submit one item and wait for its result (re-raises the batch's error)."""
        return self.submit(item).result(timeout)

    def map(self, items: Sequence[T], timeout: float | None = None) -> list[R]:
        futs = [self.submit(x) for x in items]
        return [f.result(timeout) for f in futs]

    def close(self) -> None:
        """Stop the worker after the queued items are served."""
        self._closed = True
        if self._thread is not None:
            self._q.put(_CLOSE)
            self._thread.join(timeout=10)

    def stats(self) -> dict[str, Any]:
        return {"batches": self.batches, "items": self.items, "largest": self.largest,
                "mean_batch": self.items / self.batches if self.batches else 0.0}

    # -- the worker ---------------------------------------------------------------------------
    def _ensure_started(self) -> None:
        if self._thread is not None:
            return
        with self._start_lock:
            if self._thread is None:
                t = threading.Thread(target=self._run, name=self.name, daemon=True)
                t.start()
                self._thread = t

    def _run(self) -> None:
        if self._on_start is not None:
            try:
                self._on_start()
            except Exception:  # a failed tweak must not kill the worker
                log.exception("%s: on_start failed", self.name)
        while True:
            first = self._q.get()
            if isinstance(first, _Closed):
                return
            batch = [first]
            closing = False
            deadline = time.perf_counter() + self.max_wait_s
            while len(batch) < self.max_batch:
                try:  # everything already queued joins at once; then wait out the window
                    nxt = self._q.get_nowait()
                except queue.Empty:
                    left = deadline - time.perf_counter()
                    if left <= 0:
                        break
                    try:
                        nxt = self._q.get(timeout=left)
                    except queue.Empty:
                        break
                if isinstance(nxt, _Closed):
                    closing = True
                    break
                batch.append(nxt)
            self._serve(batch)
            if closing:
                # serve what is still queued, then stop
                rest: list[tuple[T, Future[R]]] = []
                while True:
                    try:
                        x = self._q.get_nowait()
                    except queue.Empty:
                        break
                    if not isinstance(x, _Closed):
                        rest.append(x)
                for s in range(0, len(rest), self.max_batch):
                    self._serve(rest[s:s + self.max_batch])
                return

    def _serve(self, batch: list[tuple[T, Future[R]]]) -> None:
        live = [(x, f) for x, f in batch if f.set_running_or_notify_cancel()]
        if not live:
            return
        self.batches += 1
        self.items += len(live)
        self.largest = max(self.largest, len(live))
        try:
            results = self.fn([x for x, _ in live])
            if len(results) != len(live):
                raise RuntimeError(f"{self.name}: batch function returned {len(results)} results for "
                                   f"{len(live)} items")
        except BaseException as e:  # noqa: BLE001 - every caller of the batch gets the error
            for _, f in live:
                f.set_exception(e)
            return
        for (_, f), r in zip(live, results):
            f.set_result(r)


def done(value: R) -> Future[R]:
    """A future that already holds ``value``."""
    fut: Future[R] = Future()
    fut.set_result(value)
    return fut


class InFlight(Generic[R]):
    """Keyed requests in flight: concurrent callers asking for the same key share one future; what
    it resolves to goes into ``cache`` (an error is handed to every caller and cached nowhere)."""

    def __init__(self, cache: LRU[R]) -> None:
        self.cache = cache
        self._pending: dict[Any, Future[R]] = {}
        self._lock = threading.Lock()

    def get(self, key: Any, submit: Callable[[], Future[R]]) -> Future[R]:
        """The in-flight request for ``key``, else a new one started by ``submit()``."""
        with self._lock:
            fut = self._pending.get(key)
            own = fut is None
            if own:
                fut = Future()
                self._pending[key] = fut
        assert fut is not None
        if own:
            try:
                inner = submit()
            except BaseException as e:
                self._settle(key, fut, None, e)
                raise
            inner.add_done_callback(functools.partial(self._settle, key, fut, err=None))
        return fut

    def _settle(self, key: Any, fut: Future[R], inner: Future[R] | None, err: BaseException | None) -> None:
        if err is None and inner is not None:
            err = inner.exception()
        if err is None and inner is not None:
            v = inner.result()
            self.cache.put(key, v)
            with self._lock:
                self._pending.pop(key, None)
            fut.set_result(v)
        else:
            with self._lock:
                self._pending.pop(key, None)
            fut.set_exception(err)
