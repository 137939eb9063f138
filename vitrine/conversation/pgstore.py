"""Shopping sessions in PostgreSQL (``vitrine_sessions``): the store replicas on many hosts
share when the record store is PostgreSQL (vitrine/conversation/store.py has the contract)."""

from __future__ import annotations

import json
import logging
import threading
import time
from contextlib import AbstractContextManager
from typing import Any

from vitrine.errors import StorageError
from vitrine.index.pgpool import connection, ensure_schema, open_pool, psycopg, scalar
from vitrine.conversation.types import PURGE_EVERY, StoredSession

log = logging.getLogger(__name__)

T = "vitrine_sessions"
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {T} (
    id TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    vec BYTEA,
    touched DOUBLE PRECISION NOT NULL,
    version INTEGER NOT NULL DEFAULT 0
);
ALTER TABLE {T} ADD COLUMN IF NOT EXISTS version INTEGER NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS {T}_touched ON {T} (touched);
"""


class PgSessionStore:
    """Sessions in the PostgreSQL database ``url`` (its own small connection pool)."""

    def __init__(self, url: str, ttl_s: float, max_sessions: int, *, timeout_s: float = 3.0) -> None:
        self.ttl_s, self.max_sessions, self.timeout_s = ttl_s, max_sessions, timeout_s
        self._writes = 0
        self._lock = threading.Lock()
        self.pool = open_pool(url, name="vitrine-sessions", max_size=4, timeout_s=timeout_s, what="session store")
        try:
            with self._conn() as c:
                ensure_schema(c, 0x76736573, _SCHEMA)
        except BaseException:
            self.pool.close()
            raise

    def _conn(self) -> AbstractContextManager[psycopg.Connection]:
        return connection(self.pool, self.timeout_s, "session store")

    def get(self, sid: str) -> StoredSession | None:
        with self._conn() as c:
            row = c.execute(f"SELECT state, vec, touched, version FROM {T} WHERE id=%s", (sid,)).fetchone()
        if row is None:
            return None
        if time.time() - row[2] > self.ttl_s:
            return StoredSession({}, None, row[2], expired=True, version=row[3])
        return StoredSession(json.loads(row[0]), bytes(row[1]) if row[1] is not None else None, row[2],
                             version=row[3])

    def put(self, sid: str, state: dict[str, Any], vector: bytes | None, expected: int | None = None) -> bool:
        """An upsert; with ``expected``, one that updates only where the version is still the one read."""
        doc = json.dumps(state, ensure_ascii=False, separators=(",", ":"))
        sql = (f"INSERT INTO {T} (id, state, vec, touched, version) VALUES (%s, %s, %s, %s, %s) ON CONFLICT (id) "
               f"DO UPDATE SET state=excluded.state, vec=excluded.vec, touched=excluded.touched, "
               f"version={T}.version + 1")
        args: list[Any] = [sid, doc, vector, time.time(), (expected or 0) + 1]
        if expected is not None:
            sql, args = sql + f" WHERE {T}.version = %s", args + [expected]
        with self._conn() as c:
            done = c.execute(sql, args).rowcount > 0
        with self._lock:
            self._writes += 1
            due = self._writes % PURGE_EVERY == 0
        if due:
            self.purge()
        return done

    def delete(self, sid: str) -> None:
        with self._conn() as c:
            c.execute(f"DELETE FROM {T} WHERE id=%s", (sid,))

    def count(self) -> int:
        with self._conn() as c:
            return int(scalar(c.execute(f"SELECT COUNT(*) FROM {T}")))

    def purge(self) -> int:
        try:
            with self._conn() as c:
                n = c.execute(f"DELETE FROM {T} WHERE touched < %s", (time.time() - self.ttl_s,)).rowcount
                n += c.execute(f"DELETE FROM {T} WHERE id IN (SELECT id FROM {T} ORDER BY touched DESC OFFSET %s)",
                               (self.max_sessions,)).rowcount
        except StorageError as e:
            log.warning("session purge failed: %s", e)
            return 0
        return max(0, n)

    def close(self) -> None:
        self.pool.close()
