"""What every PostgreSQL-backed store of Vitrine shares (records, feedback log, rules, sessions):
a checked connection pool, connections whose errors become ``StorageError`` (the API answers
503), and a schema created once under an advisory lock (processes starting together take turns;
a read-only standby creates nothing).

The pool answers to the database's health (vitrine/index/storehealth.py): while the database is
known to be down a connection is refused at once instead of after the pool's timeout, and when
it answers again the pool is renewed, so the stores do not wait out psycopg_pool's reconnection
back-off (1, 2, 4 ... s: after a two-minute outage writes came back more than a minute late)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from vitrine.errors import MissingExtra, StorageError
from vitrine.index.storehealth import StoreHealth, health_for

try:
    import psycopg
    from psycopg_pool import ConnectionPool, PoolTimeout
except ImportError as e:  # pragma: no cover - the `postgres` extra is not installed
    raise MissingExtra("a postgresql:// store needs psycopg 3 and psycopg_pool: pip install 'vitrine[postgres]'") from e


log = logging.getLogger(__name__)
ACQUIRE_SLICE_S = 0.2  # how often a request waiting for a connection looks at the health


def _new_pool(url: str, name: str, max_size: int, timeout_s: float) -> ConnectionPool:
    return ConnectionPool(url, min_size=1, max_size=max_size, open=False, name=name,
                          kwargs={"autocommit": True, "connect_timeout": max(1, int(timeout_s))},
                          check=ConnectionPool.check_connection, timeout=timeout_s)


class StorePool:
    """A psycopg_pool pool of autocommit connections, each checked before use, renewed when the
    database answers again after an outage (:class:`~vitrine.index.storehealth.StoreHealth`)."""

    def __init__(self, url: str, *, name: str, max_size: int, timeout_s: float, what: str) -> None:
        self.url, self.name, self.max_size, self.timeout_s, self.what = url, name, max_size, timeout_s, what
        pool = _new_pool(url, name, max_size, timeout_s)
        try:
            pool.open(wait=True, timeout=timeout_s * 2)
        except PoolTimeout as e:
            pool.close()
            raise StorageError(f"cannot reach the {what}: {e}") from e
        self._pool = pool
        self.health: StoreHealth = health_for(url)
        self.health.on_recover(self.renew)

    def renew(self) -> None:
        """Swap in a new pool with fresh connections; the old one closes (connections in use are
        dropped when given back). Called by the health watcher when the database returns."""
        pool = _new_pool(self.url, self.name, self.max_size, self.timeout_s)
        try:
            pool.open(wait=True, timeout=self.timeout_s)
        except PoolTimeout as e:
            pool.close()
            raise StorageError(f"the {self.what} answers but a new pool could not connect: {e}") from e
        old, self._pool = self._pool, pool
        # closed aside: its workers may be mid-way through a connection attempt to the dead server
        threading.Thread(target=old.close, kwargs={"timeout": 10}, name=f"{self.name}-close", daemon=True).start()

    @contextmanager
    def connection(self, timeout: float | None = None) -> Iterator[psycopg.Connection]:
        with self._pool.connection(timeout=self.timeout_s if timeout is None else timeout) as c:
            yield c

    def acquire(self, timeout_s: float, what: str) -> tuple[ConnectionPool, psycopg.Connection]:
        """A connection (and the pool to give it back to), waited for in short slices: a request
        waiting while the database goes down is refused as soon as the health says so, not after
        the whole ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.health.check(what)
            pool = self._pool
            try:
                return pool, pool.getconn(timeout=max(0.01, min(ACQUIRE_SLICE_S, deadline - time.monotonic())))
            except PoolTimeout:
                if time.monotonic() >= deadline:
                    raise

    def close(self) -> None:
        self.health.off_recover(self.renew)
        self._pool.close()


def open_pool(url: str, *, name: str, max_size: int, timeout_s: float, what: str) -> StorePool:
    """An open :class:`StorePool` to ``url``; ``StorageError`` naming ``what`` when it cannot be reached."""
    return StorePool(url, name=name, max_size=max_size, timeout_s=timeout_s, what=what)


@contextmanager
def connection(pool: StorePool, timeout_s: float, what: str) -> Iterator[psycopg.Connection]:
    """A pooled connection; a database error becomes ``StorageError`` naming ``what``. Refused
    at once while the database is known to be down; a lost connection marks it down."""
    try:
        owner, c = pool.acquire(timeout_s, what)
    except PoolTimeout as e:
        raise StorageError(f"{what} unavailable: {str(e).strip()}") from e
    except psycopg.OperationalError as e:
        pool.health.failed(e)
        raise StorageError(f"{what} unavailable: {str(e).strip()}") from e
    try:
        yield c
    except psycopg.OperationalError as e:
        if not isinstance(e, psycopg.errors.QueryCanceled):  # a statement timeout is no outage
            pool.health.failed(e)
        raise StorageError(f"{what} unavailable: {str(e).strip()}") from e
    except psycopg.Error as e:
        raise StorageError(f"{what} refused: {str(e).strip()}") from e
    finally:
        owner.putconn(c)


def scalar(cur: psycopg.Cursor[Any]) -> Any:
    """The first column of the next row of ``cur``, for a query that always returns one
    (``SELECT count(*)``, ``... RETURNING iid``, a row locked by the same transaction)."""
    row = cur.fetchone()
    if row is None:
        raise StorageError("the database returned no row where it always returns one")
    return row[0]


def ensure_schema(c: psycopg.Connection, lock_id: int, schema: str) -> bool:
    """Create ``schema`` (idempotent DDL) under the advisory lock ``lock_id``, unless the database
    is a read-only standby; returns whether it is writable."""
    if scalar(c.execute("SELECT pg_is_in_recovery()")):
        return False
    with c.transaction():
        c.execute("SELECT pg_advisory_xact_lock(%s)", (lock_id,))
        c.execute(schema)
    return True
