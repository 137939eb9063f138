"""Shopper feedback, durable: every search the API answered (what it showed) and the events on it.

Two tables, the same in both stores:

- ``searches``: one row per logged search: its ``query_id``, time, the query text and its
  normalised form, the page it showed (ids in rank order, from ``offset``), the experiment and
  variant that ranked it, the hashed user token and the session. Events name a search by its
  ``query_id``, so learning needs nothing else (vitrine/search/feedback.py reads it back).
- ``events``: view, click, add_to_cart and purchase events, keyed by ``event_id`` (a client's own,
  or one made from the event's content), so a batch sent twice (an at-least-once Kafka consumer,
  a client retry) is stored once.

SQLite (:class:`EventLog`): ``events.sqlite`` in the data dir (WAL; its own file, so a flood of
events never waits on the record store's writer); events commit with ``synchronous=FULL``: a 202
means on disk. PostgreSQL (:class:`~vitrine.index.pgevents.PgEventLog`): the same tables in the
record store's database, for API replicas on many hosts.

User tokens are never stored: an HMAC of each with a key made once per log (kept in its meta
table), so one token is one user in analytics and experiments and cannot be read back.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from vitrine.errors import StorageError
from vitrine.sqlite import connect_wal

log = logging.getLogger(__name__)

EVENT_TYPES = ("view", "click", "add_to_cart", "purchase")
FILE = "events.sqlite"
_WORD = re.compile(r"\w+", re.UNICODE)


def normalise_query(text: str | None) -> str:
    """A query as feedback groups it: casefolded words joined by one space ("Red  Shoes!" and
    "red shoes" are one query). Chinese runs stay whole words."""
    return " ".join(_WORD.findall((text or "").casefold()))


def new_query_id(now: float | None = None) -> str:
    """An opaque, unique search id; its first 11 hex digits are the millisecond it was made,
    so an unknown id can be told apart from one that retention removed."""
    return f"{int((now or time.time()) * 1000):011x}{secrets.token_hex(8)}"


def query_id_time(query_id: str) -> float | None:
    """When a :func:`new_query_id` id was made (None: not one of ours)."""
    try:
        return int(query_id[:11], 16) / 1000 if len(query_id) == 27 else None
    except ValueError:
        return None


@dataclass(frozen=True)
class SearchLog:
    """One logged search: what the shopper saw (``ids`` from rank ``offset``)."""

    query_id: str
    ts: float
    text: str | None
    norm: str
    ids: tuple[str, ...]
    offset: int = 0
    total: int | None = None
    image: bool = False
    user: str | None = None  # hashed
    session: str | None = None
    experiment: str | None = None
    variant: str | None = None

    def rank_of(self, product_id: str) -> int | None:
        """The product's 0-based rank on this search's page (counting offset), None if not shown."""
        try:
            return self.offset + self.ids.index(product_id)
        except ValueError:
            return None


@dataclass(frozen=True)
class EventRecord:
    """One stored shopper event (``position``: the product's rank on the logged page)."""

    event_id: str
    query_id: str
    type: str
    product_id: str
    position: int
    ts: float
    user: str | None = None  # hashed
    session: str | None = None


@dataclass
class FeedbackSlice:
    """Searches and events between two times, as learning and analytics read them."""

    searches: list[SearchLog] = field(default_factory=list)
    events: list[EventRecord] = field(default_factory=list)


def event_key(query_id: str, etype: str, product_id: str, user: str | None, ts: float | None) -> str:
    """The id of an event sent without one: the same content is the same event."""
    raw = json.dumps([query_id, etype, product_id, user, ts], ensure_ascii=False)
    return "auto:" + hashlib.sha256(raw.encode()).hexdigest()[:32]


@runtime_checkable
class EventLogAPI(Protocol):
    """What the engine needs from a feedback log (SQLite here, PostgreSQL in pgevents.py)."""

    def hash_user(self, user: str | None) -> str | None: ...

    def log_search(self, s: SearchLog) -> None: ...

    def searches(self, query_ids: Sequence[str]) -> dict[str, SearchLog]: ...

    def add_events(self, events: Sequence[EventRecord]) -> int: ...

    def read(self, since: float = 0.0, until: float | None = None) -> FeedbackSlice: ...

    def purge(self, before: float) -> int: ...

    def counts(self) -> dict[str, int]: ...

    def get_meta(self, key: str) -> str | None: ...

    def set_meta(self, key: str, value: str) -> None: ...

    def close(self) -> None: ...


_SCHEMA = """
CREATE TABLE IF NOT EXISTS searches (
    query_id TEXT PRIMARY KEY, ts REAL NOT NULL, text TEXT, norm TEXT NOT NULL, ids TEXT NOT NULL,
    "offset" INTEGER NOT NULL DEFAULT 0, total INTEGER, image INTEGER NOT NULL DEFAULT 0,
    user_hash TEXT, session TEXT, experiment TEXT, variant TEXT
);
CREATE INDEX IF NOT EXISTS searches_ts ON searches(ts);
CREATE TABLE IF NOT EXISTS events (
    event_id TEXT PRIMARY KEY, query_id TEXT NOT NULL, type TEXT NOT NULL, product_id TEXT NOT NULL,
    position INTEGER NOT NULL, ts REAL NOT NULL, user_hash TEXT, session TEXT
);
CREATE INDEX IF NOT EXISTS events_ts ON events(ts);
CREATE INDEX IF NOT EXISTS events_query ON events(query_id);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
SEARCH_COLUMNS = 'query_id, ts, text, norm, ids, "offset", total, image, user_hash, session, experiment, variant'
EVENT_COLUMNS = "event_id, query_id, type, product_id, position, ts, user_hash, session"


def search_row(s: SearchLog) -> tuple:
    return (s.query_id, s.ts, s.text, s.norm, json.dumps(list(s.ids), ensure_ascii=False), s.offset, s.total,
            int(s.image), s.user, s.session, s.experiment, s.variant)


def search_from_row(r: Sequence) -> SearchLog:
    qid, ts, text, norm, ids, offset, total, image, user, session, exp, variant = r
    ids_list = ids if isinstance(ids, list) else json.loads(ids)
    return SearchLog(query_id=qid, ts=float(ts), text=text, norm=norm, ids=tuple(ids_list), offset=int(offset),
                     total=total, image=bool(image), user=user, session=session, experiment=exp, variant=variant)


def event_row(e: EventRecord) -> tuple:
    return (e.event_id, e.query_id, e.type, e.product_id, e.position, e.ts, e.user, e.session)


def event_from_row(r: Sequence) -> EventRecord:
    eid, qid, etype, pid, pos, ts, user, session = r
    return EventRecord(event_id=eid, query_id=qid, type=etype, product_id=pid, position=int(pos), ts=float(ts),
                       user=user, session=session)


class UserHasher:
    """HMAC-SHA256 of user tokens under one key per log (made once, kept in its meta table)."""

    def __init__(self, key: bytes) -> None:
        self.key = key

    def __call__(self, user: str | None) -> str | None:
        if not user:
            return None
        return hmac.new(self.key, user.encode(), hashlib.sha256).hexdigest()[:24]


class EventLog:
    """The SQLite feedback log of one data dir (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        try:
            # events: FULL (a 202 means on disk); searches: NORMAL (survives a killed process; a
            # search lost to a power cut only loses its events' context)
            self._events = connect_wal(self.path, synchronous="FULL", check_same_thread=False, isolation_level=None)
            self._events.executescript(_SCHEMA)
            self._searches = connect_wal(self.path, synchronous="NORMAL", check_same_thread=False,
                                         isolation_level=None)
        except sqlite3.DatabaseError as e:
            raise StorageError(f"cannot open the event log {self.path}: {e}") from e
        self._search_lock = threading.Lock()
        self.hash_user = UserHasher(self._user_key())

    def _user_key(self) -> bytes:
        key = secrets.token_hex(32)
        with self._lock:
            self._events.execute("INSERT OR IGNORE INTO meta VALUES ('user_key', ?)", (key,))
            return bytes.fromhex(self._events.execute("SELECT value FROM meta WHERE key='user_key'").fetchone()[0])

    def get_meta(self, key: str) -> str | None:
        with self._lock:
            row = self._events.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        with self._lock:
            self._events.execute("INSERT INTO meta VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                                 (key, value))

    def close(self) -> None:
        with self._lock, self._search_lock:
            self._events.close()
            self._searches.close()

    def log_search(self, s: SearchLog) -> None:
        try:
            with self._search_lock:
                self._searches.execute(f"INSERT OR REPLACE INTO searches ({SEARCH_COLUMNS}) VALUES "
                                       "(?,?,?,?,?,?,?,?,?,?,?,?)", search_row(s))
        except sqlite3.Error as e:
            raise StorageError(f"cannot log a search in {self.path}: {e}") from e

    def searches(self, query_ids: Sequence[str]) -> dict[str, SearchLog]:
        out: dict[str, SearchLog] = {}
        ids = list(dict.fromkeys(query_ids))
        with self._search_lock:
            for i in range(0, len(ids), 500):
                part = ids[i:i + 500]
                rows = self._searches.execute(f"SELECT {SEARCH_COLUMNS} FROM searches WHERE query_id IN "
                                              f"({','.join('?' * len(part))})", part).fetchall()
                out.update((r[0], search_from_row(r)) for r in rows)
        return out

    def add_events(self, events: Sequence[EventRecord]) -> int:
        """Store ``events`` in one transaction; returns how many were new (the rest were already
        stored: same ``event_id``)."""
        if not events:
            return 0
        try:
            with self._lock:
                before = self._events.total_changes
                self._events.execute("BEGIN IMMEDIATE")
                try:
                    self._events.executemany(f"INSERT OR IGNORE INTO events ({EVENT_COLUMNS}) VALUES "
                                             "(?,?,?,?,?,?,?,?)", [event_row(e) for e in events])
                except BaseException:
                    self._events.execute("ROLLBACK")
                    raise
                self._events.execute("COMMIT")
                return self._events.total_changes - before
        except sqlite3.Error as e:
            raise StorageError(f"cannot store events in {self.path}: {e}") from e

    def read(self, since: float = 0.0, until: float | None = None) -> FeedbackSlice:
        until = time.time() + 1e9 if until is None else until
        with self._search_lock:
            s = [search_from_row(r) for r in self._searches.execute(
                f"SELECT {SEARCH_COLUMNS} FROM searches WHERE ts >= ? AND ts < ? ORDER BY ts", (since, until))]
            e = [event_from_row(r) for r in self._searches.execute(
                f"SELECT {EVENT_COLUMNS} FROM events WHERE ts >= ? AND ts < ? ORDER BY ts", (since, until))]
        return FeedbackSlice(s, e)

    def purge(self, before: float) -> int:
        """Forget searches and events older than ``before`` (retention); returns rows removed."""
        with self._lock:
            self._events.execute("BEGIN IMMEDIATE")
            n = self._events.execute("DELETE FROM events WHERE ts < ?", (before,)).rowcount
            n += self._events.execute("DELETE FROM searches WHERE ts < ?", (before,)).rowcount
            self._events.execute("COMMIT")
        return n

    def counts(self) -> dict[str, int]:
        with self._search_lock:
            return {"searches": self._searches.execute("SELECT COUNT(*) FROM searches").fetchone()[0],
                    "events": self._searches.execute("SELECT COUNT(*) FROM events").fetchone()[0]}


def open_event_log(store: str | None, data_dir: str | os.PathLike[str], *, pool: object | None = None) -> EventLogAPI:
    """The feedback log beside a record store: ``events.sqlite`` in the data dir (SQLite), or
    tables in the PostgreSQL database (``pool``: the record store's connection pool)."""
    if store and str(store).split("://", 1)[0] in ("postgresql", "postgres"):
        from vitrine.index.pgevents import PgEventLog  # noqa: PLC0415 - psycopg is an extra

        return PgEventLog(str(store), pool=pool)
    return EventLog(Path(data_dir) / FILE)

