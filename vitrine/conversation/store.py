"""Where shopping sessions live: the standing query of each session id (docs/sessions.md).

A session is one small JSON document (its words, slots, filters, the ids it last showed) plus,
when the shopper searched with a photo, that photo's query vector (float32 bytes, never the
photo). Three stores keep the same contract:

- :class:`MemorySessionStore`: one process (tests, a single worker): a bounded LRU.
- :class:`SqliteSessionStore`: ``sessions.sqlite`` in the data dir, its own file and table
  (``sessions``), so every worker process on the host sees the same sessions and a worker restart
  loses none; writes never wait on the record store's lock.
- ``PgSessionStore`` (vitrine/conversation/pgstore.py): the ``vitrine_sessions`` table of the
  PostgreSQL record store, shared by replicas on many hosts.

Every store expires a session ``ttl_s`` after its last write (an expired one reads as absent,
with ``expired`` said) and keeps at most ``max_sessions`` (the least recently written go first).
Purging runs every ``PURGE_EVERY`` writes, not on every search. What every store shares (a session
as stored, the interface) is vitrine/conversation/types.py.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from vitrine.errors import StorageError
from vitrine.sqlite import connect_wal
from vitrine.conversation.types import PURGE_EVERY, SessionStoreAPI, StoredSession

log = logging.getLogger(__name__)


class MemorySessionStore:
    """Sessions in this process only: a bounded LRU (``max_sessions``) with idle expiry."""

    def __init__(self, ttl_s: float, max_sessions: int) -> None:
        self.ttl_s, self.max_sessions = ttl_s, max_sessions
        self._items: OrderedDict[str, StoredSession] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, sid: str) -> StoredSession | None:
        with self._lock:
            s = self._items.get(sid)
            if s is None:
                return None
            if time.time() - s.touched > self.ttl_s:
                return StoredSession({}, None, s.touched, expired=True, version=s.version)
            return s

    def put(self, sid: str, state: dict[str, Any], vector: bytes | None, expected: int | None = None) -> bool:
        with self._lock:
            old = self._items.pop(sid, None)
            version = old.version if old is not None else 0
            if expected is not None and expected != version:
                if old is not None:
                    self._items[sid] = old
                return False
            self._items[sid] = StoredSession(state, vector, time.time(), version=version + 1)
            while len(self._items) > self.max_sessions:
                self._items.popitem(last=False)
        return True

    def delete(self, sid: str) -> None:
        with self._lock:
            self._items.pop(sid, None)

    def count(self) -> int:
        return len(self._items)

    def purge(self) -> int:
        cutoff = time.time() - self.ttl_s
        with self._lock:
            old = [k for k, s in self._items.items() if s.touched < cutoff]
            for k in old:
                del self._items[k]
        return len(old)

    def close(self) -> None:
        pass


_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    vec BLOB,
    touched REAL NOT NULL,
    version INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS sessions_touched ON sessions(touched);
"""
# a session written with ``expected``: inserted, or updated only where its version is still the one read
_PUT = ("INSERT INTO sessions (id, state, vec, touched, version) VALUES (?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE "
        "SET state=excluded.state, vec=excluded.vec, touched=excluded.touched, version=sessions.version + 1")


class SqliteSessionStore:
    """Sessions in ``path`` (WAL): every process on the host shares them."""

    def __init__(self, path: str | os.PathLike[str], ttl_s: float, max_sessions: int) -> None:
        self.path = Path(path)
        self.ttl_s, self.max_sessions = ttl_s, max_sessions
        self._lock = threading.Lock()
        self._writes = 0
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = connect_wal(self.path, check_same_thread=False, isolation_level=None)
            self._conn.executescript(_SCHEMA)
            cols = {r[1] for r in self._conn.execute("PRAGMA table_info(sessions)")}
            if "version" not in cols:  # a store written before versions
                self._conn.execute("ALTER TABLE sessions ADD COLUMN version INTEGER NOT NULL DEFAULT 0")
        except sqlite3.Error as e:
            raise StorageError(f"cannot open the session store {self.path}: {e}") from e

    def get(self, sid: str) -> StoredSession | None:
        try:
            with self._lock:
                row = self._conn.execute("SELECT state, vec, touched, version FROM sessions WHERE id=?",
                                         (sid,)).fetchone()
        except sqlite3.Error as e:
            raise StorageError(f"session store: {e}") from e
        if row is None:
            return None
        if time.time() - row[2] > self.ttl_s:
            return StoredSession({}, None, row[2], expired=True, version=row[3])
        return StoredSession(json.loads(row[0]), row[1], row[2], version=row[3])

    def put(self, sid: str, state: dict[str, Any], vector: bytes | None, expected: int | None = None) -> bool:
        doc = json.dumps(state, ensure_ascii=False, separators=(",", ":"))
        sql, args = _PUT, [sid, doc, vector, time.time(), (expected or 0) + 1]
        if expected is not None:
            sql, args = sql + " WHERE sessions.version = ?", args + [expected]
        try:
            with self._lock:
                done = self._conn.execute(sql, args).rowcount > 0
                self._writes += 1
                due = self._writes % PURGE_EVERY == 0
        except sqlite3.Error as e:
            raise StorageError(f"session store: {e}") from e
        if due:
            self.purge()
        return done

    def delete(self, sid: str) -> None:
        with self._lock:
            self._conn.execute("DELETE FROM sessions WHERE id=?", (sid,))

    def count(self) -> int:
        with self._lock:
            return int(self._conn.execute("SELECT COUNT(*) FROM sessions").fetchone()[0])

    def purge(self) -> int:
        """Drop expired sessions, then the least recently written beyond ``max_sessions``."""
        try:
            with self._lock:
                n = self._conn.execute("DELETE FROM sessions WHERE touched < ?", (time.time() - self.ttl_s,)).rowcount
                n += self._conn.execute(
                    "DELETE FROM sessions WHERE id IN (SELECT id FROM sessions ORDER BY touched DESC LIMIT -1 OFFSET ?)",
                    (self.max_sessions,)).rowcount
        except sqlite3.Error as e:
            log.warning("session purge failed: %s", e)
            return 0
        return max(0, n)

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def open_session_store(kind: str, *, data_dir: str | os.PathLike[str], database_url: str | None,
                       ttl_s: float, max_sessions: int) -> SessionStoreAPI:
    """The session store of a data dir: ``kind`` "memory" (this process), else the record store's
    home: PostgreSQL when ``database_url`` is given, else ``sessions.sqlite`` in ``data_dir``."""
    if kind == "memory":
        return MemorySessionStore(ttl_s, max_sessions)
    if database_url:
        from vitrine.conversation.pgstore import PgSessionStore  # psycopg is an extra

        return PgSessionStore(database_url, ttl_s, max_sessions)
    return SqliteSessionStore(Path(data_dir) / "sessions.sqlite", ttl_s, max_sessions)
