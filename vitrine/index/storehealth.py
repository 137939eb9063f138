"""Whether the shared PostgreSQL store answers, known without waiting on it.

Why: with the store crashed, every request that needed it waited for a pooled connection until
the pool's timeout (3-6 s) before it failed, and after the store came back the pool's own
reconnection backed off exponentially (1, 2, 4 ... s), so writes resumed 10 s, or more than a
minute, after the database did. A replica holds its vectors, graph and a mirror of the
documents (vitrine/index/mirror.py) locally, so reads need not wait at all.

One :class:`StoreHealth` per database URL and process (:func:`health_for`), shared by every
store on that URL (records, feedback log, rules, sessions). A watcher thread asks the database
``SELECT 1`` every ``interval_s`` on a connection of its own: two failures in a row mark the store
down (a store whose connection was lost marks it down at once, :meth:`StoreHealth.failed`); while down it tries a
new connection every ``interval_s`` and, when one succeeds, marks the store up and runs the
stores' recovery callbacks (their pools drop dead connections and connect again at once).
While down, :meth:`StoreHealth.check` raises ``StorageError`` without touching the network:
writes are refused at once (the API answers 503), reads go to what the process holds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from vitrine.errors import StorageError

log = logging.getLogger(__name__)

INTERVAL_S = 0.5
CONNECT_TIMEOUT_S = 2
MISSES = 2  # probes failed in a row before the watcher calls the database down


class StoreHealth:
    """The up/down state of one database and the watcher that keeps it current."""

    def __init__(self, url: str, *, interval_s: float = INTERVAL_S, name: str = "store",
                 probe: Callable[[], bool] | None = None) -> None:
        self.url, self.name, self.interval_s = url, name, interval_s
        self._probe_fn = probe
        self._lock = threading.Lock()
        self._up = True
        self._down_since: float | None = None
        self._last_ok = time.time()
        self._outages = 0
        self._recover: list[Callable[[], None]] = []
        self._conn: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- state ------------------------------------------------------------------------------
    @property
    def up(self) -> bool:
        return self._up

    @property
    def stale_s(self) -> float:
        """Seconds since the database last answered while it is down (0.0 while up)."""
        return 0.0 if self._up else round(time.time() - self._last_ok, 1)

    def status(self) -> dict[str, Any]:
        return {"up": self._up, "stale_s": self.stale_s, "outages": self._outages,
                "down_since": self._down_since}

    def check(self, what: str) -> None:
        """Raise ``StorageError`` at once while the database is known to be down."""
        if not self._up:
            raise StorageError(f"{what} unavailable: the database has not answered for {self.stale_s:.0f} s "
                               "(writes are refused until it does; searches serve what this process holds)")

    def failed(self, e: BaseException | None = None) -> None:
        """A store's query could not reach the database: down until the watcher sees it again."""
        with self._lock:
            if not self._up:
                return
            self._up, self._down_since = False, time.time()
            self._outages += 1
        log.warning("the %s stopped answering (%s): writes refused, reads from local copies", self.name,
                    str(e).strip()[:200] if e else "no answer")
        self._close_conn()

    def on_recover(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` (in the watcher thread) each time the database answers again after an outage."""
        with self._lock:
            self._recover.append(fn)

    def off_recover(self, fn: Callable[[], None]) -> None:
        with self._lock:
            if fn in self._recover:
                self._recover.remove(fn)

    # -- the watcher ------------------------------------------------------------------------
    def start(self) -> StoreHealth:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="vitrine-store-health", daemon=True)
                self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._close_conn()

    def _watch(self) -> None:
        misses = 0
        while not self._stop.wait(self.interval_s):
            ok = self._probe()
            misses = 0 if ok else misses + 1
            if ok:
                self._last_ok = time.time()
                if not self._up:
                    self._recovered()
            elif self._up and misses >= MISSES:  # one slow answer on a loaded host is no outage
                self.failed(None)

    def _recovered(self) -> None:
        for fn in list(self._recover):
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - one store's pool must not keep the others down
                log.warning("recovering a %s pool failed: %s", self.name, e)
        with self._lock:
            down_for = time.time() - (self._down_since or time.time())
            self._up, self._down_since = True, None
        log.warning("the %s answers again after %.1f s: writes accepted", self.name, down_for)

    def _probe(self) -> bool:
        if self._probe_fn is not None:
            return self._probe_fn()
        import psycopg  # the `postgres` extra: only stores on a database URL get here

        try:
            if self._conn is None or self._conn.closed:
                self._conn = psycopg.connect(self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
            self._conn.execute("SELECT 1")
            return True
        except psycopg.Error:
            self._close_conn()
            return False

    def _close_conn(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - closing a dead connection may fail in any way
                pass


_registry: dict[str, StoreHealth] = {}
_registry_lock = threading.Lock()


def health_for(url: str) -> StoreHealth:
    """The process's one :class:`StoreHealth` for ``url``, its watcher started."""
    with _registry_lock:
        h = _registry.get(url)
        if h is None:
            h = _registry[url] = StoreHealth(url, name="record store")
        return h.start()
