"""What every PostgreSQL-backed store of Vitrine shares (records, feedback log, rules, sessions):
a checked connection pool, connections whose errors become ``StorageError`` (the API answers
503), and a schema created once under an advisory lock (processes starting together take turns;
a read-only standby creates nothing)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from vitrine.errors import MissingExtra, StorageError

try:
    import psycopg
    from psycopg_pool import ConnectionPool, PoolTimeout
except ImportError as e:  # pragma: no cover - the `postgres` extra is not installed
    raise MissingExtra("a postgresql:// store needs psycopg 3 and psycopg_pool: pip install 'vitrine[postgres]'") from e


def open_pool(url: str, *, name: str, max_size: int, timeout_s: float, what: str) -> ConnectionPool:
    """An open pool of autocommit connections to ``url``, each checked before use (a restarted
    database is reconnected to); ``StorageError`` naming ``what`` when it cannot be reached."""
    pool = ConnectionPool(url, min_size=1, max_size=max_size, open=False, name=name,
                          kwargs={"autocommit": True, "connect_timeout": max(1, int(timeout_s))},
                          check=ConnectionPool.check_connection, timeout=timeout_s)
    try:
        pool.open(wait=True, timeout=timeout_s * 2)
    except PoolTimeout as e:
        pool.close()
        raise StorageError(f"cannot reach the {what}: {e}") from e
    return pool


@contextmanager
def connection(pool: ConnectionPool, timeout_s: float, what: str) -> Iterator[psycopg.Connection]:
    """A pooled connection; a database error becomes ``StorageError`` naming ``what``."""
    try:
        with pool.connection(timeout=timeout_s) as c:
            yield c
    except (psycopg.OperationalError, PoolTimeout) as e:
        raise StorageError(f"{what} unavailable: {str(e).strip()}") from e
    except psycopg.Error as e:
        raise StorageError(f"{what} refused: {str(e).strip()}") from e


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
