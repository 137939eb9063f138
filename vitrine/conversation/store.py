"""Where shopping sessions live: the standing query of each session id (docs/sessions.md).

A session is one small JSON document (its words, slots, filters, the ids it last showed) plus,
when the shopper searched with a photo, that photo's query vector (float32 bytes, never the
photo). Two stores keep the same contract:

- :class:`MemorySessionStore`: one process (tests, a single worker): a bounded LRU.
- :class:`SessionStore` on SQLite: ``sessions.sqlite`` in the data dir, its own file and table
  (``sessions``), so every worker process on the host sees the same sessions and a worker restart
  loses none; writes never wait on the record store's lock.
- :class:`SessionStore` on PostgreSQL: the ``vitrine_sessions`` table of the PostgreSQL record
  store, shared by replicas on many hosts.

Both through SQLAlchemy Core (vitrine/sqldb.py); the table, its schema version and upgrades:
vitrine/conversation/tables.py.

Every store expires a session ``ttl_s`` after its last write (an expired one reads as absent,
with ``expired`` said) and keeps at most ``max_sessions`` (the least recently written go first).
Purging runs every ``PURGE_EVERY`` writes, not on every search. What every store shares (a session
as stored, the interface) is vitrine/conversation/types.py.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from vitrine.conversation import tables
from vitrine.conversation.types import PURGE_EVERY, SessionStoreAPI, StoredSession
from vitrine.errors import StorageError
from vitrine.index.store import is_database_url
from vitrine.sqldb import SqlDb

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
            old = self._items.get(sid)
            version = old.version if old is not None else 0
            if expected is not None and expected != version:
                return False
            self._items.pop(sid, None)
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


class SessionStore:
    """Sessions in ``target``: a SQLite file (WAL: every process on the host shares them) or a
    PostgreSQL URL (every replica shares them)."""

    def __init__(self, target: str | os.PathLike[str], ttl_s: float, max_sessions: int, *,
                 timeout_s: float = 3.0) -> None:
        self.path = None if is_database_url(str(target)) else Path(target)
        self.ttl_s, self.max_sessions = ttl_s, max_sessions
        self._lock = threading.Lock()
        self._writes = 0
        self._db = SqlDb(target, what="session store", timeout_s=timeout_s)
        try:
            tables.ensure(self._db)
        except BaseException:
            self._db.close()
            raise
        self.t = t = tables.sessions_for(self._db)
        # the statements of every session search, built once (SQLAlchemy caches their compiled SQL)
        self._get = sa.select(t.c.state, t.c.vec, t.c.touched, t.c.version).where(t.c.id == sa.bindparam("sid"))
        ins = self._db.insert(t)
        upsert = {"state": ins.excluded.state, "vec": ins.excluded.vec, "touched": ins.excluded.touched,
                  "version": t.c.version + 1}
        self._put = ins.on_conflict_do_update(index_elements=["id"], set_=upsert)
        # compare-and-swap: inserted, or updated only where the version is still the one read; RETURNING
        # says whether a row was written (psycopg's rowcount is -1 in autocommit)
        self._put_if = ins.on_conflict_do_update(index_elements=["id"], set_=upsert,
                                                 where=t.c.version == sa.bindparam("expected")).returning(t.c.version)

    def get(self, sid: str) -> StoredSession | None:
        def read() -> Any:
            with self._db.tx(single=True) as c:
                return c.execute(self._get, {"sid": sid}).first()

        row = self._db.tried(read)
        if row is None:
            return None
        if time.time() - row[2] > self.ttl_s:
            return StoredSession({}, None, row[2], expired=True, version=row[3])
        return StoredSession(json.loads(row[0]), bytes(row[1]) if row[1] is not None else None, row[2],
                             version=row[3])

    def put(self, sid: str, state: dict[str, Any], vector: bytes | None, expected: int | None = None) -> bool:
        doc = json.dumps(state, ensure_ascii=False, separators=(",", ":"))
        values = {"id": sid, "state": doc, "vec": vector, "touched": time.time(), "version": (expected or 0) + 1}

        def write() -> bool:  # safe to run again (SqlDb.tried): a CAS that did land fails as a lost race
            with self._db.tx(write=True, single=True) as c:
                if expected is None:
                    c.execute(self._put, values)
                    return True
                return c.execute(self._put_if, {**values, "expected": expected}).first() is not None

        done = self._db.tried(write)
        with self._lock:
            self._writes += 1
            due = self._writes % PURGE_EVERY == 0
        if due:
            self.purge()
        return done

    def delete(self, sid: str) -> None:
        with self._db.tx(write=True, single=True) as c:
            c.execute(sa.delete(self.t).where(self.t.c.id == sid))

    def count(self) -> int:
        with self._db.tx(single=True) as c:
            return int(c.execute(sa.select(sa.func.count()).select_from(self.t)).scalar_one())

    def purge(self) -> int:
        """Drop expired sessions, then the least recently written beyond ``max_sessions``."""
        t = self.t
        newest = sa.select(t.c.id).order_by(t.c.touched.desc()).offset(self.max_sessions)
        try:
            with self._db.tx(write=True) as c:
                n = c.execute(sa.delete(t).where(t.c.touched < time.time() - self.ttl_s)).rowcount
                n += c.execute(sa.delete(t).where(t.c.id.in_(newest.scalar_subquery()))).rowcount
        except StorageError as e:
            log.warning("session purge failed: %s", e)
            return 0
        return max(0, n)

    def close(self) -> None:
        self._db.close()


def open_session_store(kind: str, *, data_dir: str | os.PathLike[str], database_url: str | None,
                       ttl_s: float, max_sessions: int) -> SessionStoreAPI:
    """The session store of a data dir: ``kind`` "memory" (this process), else the record store's
    home: PostgreSQL when ``database_url`` is given, else ``sessions.sqlite`` in ``data_dir``."""
    if kind == "memory":
        return MemorySessionStore(ttl_s, max_sessions)
    if database_url:
        return SessionStore(database_url, ttl_s, max_sessions)
    return SessionStore(Path(data_dir) / "sessions.sqlite", ttl_s, max_sessions)
