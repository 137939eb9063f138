"""Shopper feedback, durable: every search the API answered (what it showed) and the events on it.

Two tables, the same in both stores:

- ``searches``: one row per logged search: its ``query_id``, time, the query text and its
  normalised form, the page it showed (ids in rank order, from ``offset``), the experiment and
  variant that ranked it, the hashed user token and the session. Events name a search by its
  ``query_id``, so learning needs nothing else (vitrine/feedback/intake.py reads it back).
- ``events``: view, click, add_to_cart and purchase events, keyed by ``event_id`` (a client's own,
  or one made from the event's content), so a batch sent twice (an at-least-once Kafka consumer,
  a client retry) is stored once.

What both logs share: vitrine/feedback/types.py (the records, the interface) and
vitrine/feedback/event_sql.py (their columns and the SQL both run).

SQLite (:class:`EventLog`): ``events.sqlite`` in the data dir (WAL; its own file, so a flood of
events never waits on the record store's writer); events commit with ``synchronous=FULL``: a 202
means on disk. PostgreSQL (:class:`~vitrine.feedback.pgevents.PgEventLog`): the same tables in the
record store's database, for API replicas on many hosts.

User tokens are never stored: an HMAC of each with a key made once per log (kept in its meta
table), so one token is one user in analytics and experiments and cannot be read back.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from vitrine.errors import StorageError
from vitrine.feedback.event_sql import (
    BOTS_SQL,
    EXPERIMENT_SEARCH_CLICKS_SQL,
    EXPERIMENT_SEARCHES_SQL,
    bot_params,
    EVENT_COLUMNS,
    EXPERIMENTS_SCHEMA,
    EXPERIMENT_CLICKS_SQL,
    EXPERIMENT_UNITS_SQL,
    ADDED_COLUMNS,
    POPULAR_SQL,
    SEARCH_COLUMNS,
    analytics_rows,
    analytics_sql,
    event_from_row,
    event_row,
    experiment_unit_rows,
    search_from_row,
    search_row,
)
from vitrine.feedback.types import EventLogAPI, EventRecord, FeedbackSlice, SearchLog, UserHasher
from vitrine.sqlite import connect_wal
from vitrine.index.store import is_database_url

log = logging.getLogger(__name__)

FILE = "events.sqlite"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS searches (
    query_id TEXT PRIMARY KEY, ts REAL NOT NULL, text TEXT, norm TEXT NOT NULL, ids TEXT NOT NULL,
    "offset" INTEGER NOT NULL DEFAULT 0, total INTEGER, image INTEGER NOT NULL DEFAULT 0,
    user_hash TEXT, session TEXT, experiment TEXT, variant TEXT, client TEXT, sort TEXT, filters TEXT
);
CREATE INDEX IF NOT EXISTS searches_ts ON searches(ts);
CREATE TABLE IF NOT EXISTS events (
    event_id TEXT PRIMARY KEY, query_id TEXT NOT NULL, type TEXT NOT NULL, product_id TEXT NOT NULL,
    position INTEGER NOT NULL, ts REAL NOT NULL, user_hash TEXT, session TEXT, client TEXT
);
CREATE INDEX IF NOT EXISTS events_ts ON events(ts);
CREATE INDEX IF NOT EXISTS events_query ON events(query_id);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

class SqliteAnalytics:
    """The SQLite event log's analytics and experiment tables (a base of :class:`EventLog`)."""

    _SQL = analytics_sql(p="?", bucket="CAST(ts / ? AS INTEGER)", c="")
    _UNITS = EXPERIMENT_UNITS_SQL.format(p="?", c="", searches="searches", events="events")
    _BOTS = BOTS_SQL.format(p="?", minute="CAST(ts / ? AS INTEGER)", events="events")
    _CLICKS = EXPERIMENT_CLICKS_SQL.format(p="?", teams="experiment_teams", events="events")
    # set by EventLog.__init__
    path: Path
    _searches: sqlite3.Connection
    _search_lock: threading.Lock
    _reads: sqlite3.Connection
    _read_lock: threading.Lock

    def _read_conn(self) -> tuple[sqlite3.Connection, threading.Lock]:
        """Reads (analytics, learning, experiments, validation) have a connection of their own: a
        long scan never holds the lock that logging a search takes (WAL: readers never block the writer)."""
        return self._reads, self._read_lock

    def _ensure_experiment_tables(self) -> None:
        if getattr(self, "_exp_ready", False):
            return
        conn, lock = self._read_conn()
        with lock:
            conn.executescript(EXPERIMENTS_SCHEMA.format(experiments="experiments", teams="experiment_teams",
                                                          searches="searches", real="REAL"))
        self._exp_ready = True

    def experiment_searches(self, experiment: str, since: float, until: float
                            ) -> tuple[list[tuple[str, list[str], str | None]], list[tuple[str, str]]]:
        """An experiment's searches in a window (query_id, ids, variant) and the clicks on them."""
        conn, lock = self._read_conn()
        args = (experiment, since, until)
        with lock:
            rows = conn.execute(EXPERIMENT_SEARCHES_SQL.format(p="?", searches="searches"), args).fetchall()
            clicks = conn.execute(EXPERIMENT_SEARCH_CLICKS_SQL.format(p="?", searches="searches", events="events"),
                                  args).fetchall()
        return [(q, json.loads(ids), v) for q, ids, v in rows], [(q, p) for q, p in clicks]

    def bots(self, since: float, until: float, per_minute: int) -> tuple[int, int]:
        """The clients the bot filter catches between two times, and their events there."""
        conn, lock = self._read_conn()
        try:
            with lock:
                row = conn.execute(self._BOTS, bot_params(since, until, per_minute)).fetchone()
        except sqlite3.Error as e:
            raise StorageError(f"cannot read analytics from {self.path}: {e}") from e
        return int(row[0] or 0), int(row[1] or 0)

    def aggregate(self, since: float, until: float, bucket_s: float, top: int) -> dict[str, list[tuple]]:
        """Analytics counts between two times (see :func:`analytics_sql`)."""
        conn, lock = self._read_conn()

        def run(q: str, params: tuple) -> list[tuple]:
            with lock:
                return conn.execute(q, params).fetchall()

        try:
            return analytics_rows(run, self._SQL, since, until, float(bucket_s), top)
        except sqlite3.Error as e:
            raise StorageError(f"cannot read analytics from {self.path}: {e}") from e

    def save_experiment(self, name: str, spec: str, updated: float) -> None:
        """Create or replace one experiment (its spec: JSON text)."""
        self._ensure_experiment_tables()
        conn, lock = self._read_conn()
        try:
            with lock:
                conn.execute("INSERT INTO experiments VALUES (?, ?, ?) ON CONFLICT(name) DO UPDATE SET "
                             "spec=excluded.spec, updated=excluded.updated", (name, spec, updated))
        except sqlite3.Error as e:
            raise StorageError(f"cannot save experiment {name!r}: {e}") from e

    def experiment_specs(self) -> list[tuple[str, str, float]]:
        """Every experiment: (name, spec JSON, updated)."""
        self._ensure_experiment_tables()
        conn, lock = self._read_conn()
        with lock:
            return [tuple(r) for r in conn.execute("SELECT name, spec, updated FROM experiments ORDER BY name")]

    def log_teams(self, query_id: str, experiment: str, teams: str) -> None:
        """Which variant (team) contributed each product of an interleaved search (JSON text)."""
        self._ensure_experiment_tables()
        conn, lock = self._read_conn()
        try:
            with lock:
                conn.execute("INSERT OR REPLACE INTO experiment_teams VALUES (?, ?, ?)", (query_id, experiment, teams))
        except sqlite3.Error as e:
            raise StorageError(f"cannot log an interleaved search: {e}") from e

    def experiment_units(self, experiment: str, since: float = 0.0, until: float | None = None) -> list[tuple]:
        """Per variant and unit (hashed user, else ``session:<id>``): (variant, unit, searches,
        clicked, carted, bought, sum of reciprocal first-click ranks)."""
        self._ensure_experiment_tables()
        conn, lock = self._read_conn()
        with lock:
            rows = conn.execute(self._UNITS, (experiment, since, time.time() + 1e9 if until is None else until))
            return experiment_unit_rows(rows.fetchall())

    def interleaved_clicks(self, experiment: str, since: float = 0.0) -> list[tuple[str, str, str]]:
        """(query_id, teams JSON, clicked product id) of an interleaved experiment's searches."""
        self._ensure_experiment_tables()
        conn, lock = self._read_conn()
        with lock:
            return [tuple(r) for r in conn.execute(self._CLICKS, (experiment, since))]


class EventLog(SqliteAnalytics):
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
            for table, col in ADDED_COLUMNS:  # a log made before these columns
                have = {r[1] for r in self._events.execute(f"PRAGMA table_info({table})")}
                if col not in have:
                    self._events.execute(f"ALTER TABLE {table} ADD COLUMN {col} TEXT")
            self._searches = connect_wal(self.path, synchronous="NORMAL", check_same_thread=False,
                                         isolation_level=None)
        except sqlite3.DatabaseError as e:
            raise StorageError(f"cannot open the event log {self.path}: {e}") from e
        self._search_lock = threading.Lock()
        try:
            self._reads = connect_wal(self.path, synchronous="NORMAL", check_same_thread=False, isolation_level=None)
        except sqlite3.DatabaseError as e:
            raise StorageError(f"cannot open the event log {self.path}: {e}") from e
        self._read_lock = threading.Lock()
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
        with self._lock, self._search_lock, self._read_lock:
            self._events.close()
            self._searches.close()
            self._reads.close()

    def log_search(self, s: SearchLog) -> None:
        try:
            with self._search_lock:
                self._searches.execute(f"INSERT OR REPLACE INTO searches ({SEARCH_COLUMNS}) VALUES "
                                       "(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", search_row(s))
        except sqlite3.Error as e:
            raise StorageError(f"cannot log a search in {self.path}: {e}") from e

    def log_searches(self, batch: Sequence[SearchLog]) -> None:
        """Log ``batch`` in one transaction (vitrine/feedback/logwriter.py writes this way)."""
        try:
            with self._search_lock:
                self._searches.execute("BEGIN")
                try:
                    self._searches.executemany(f"INSERT OR REPLACE INTO searches ({SEARCH_COLUMNS}) VALUES "
                                               "(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", [search_row(s) for s in batch])
                except BaseException:
                    self._searches.execute("ROLLBACK")
                    raise
                self._searches.execute("COMMIT")
        except sqlite3.Error as e:
            raise StorageError(f"cannot log searches in {self.path}: {e}") from e

    def searches(self, query_ids: Sequence[str]) -> dict[str, SearchLog]:
        out: dict[str, SearchLog] = {}
        ids = list(dict.fromkeys(query_ids))
        conn, lock = self._read_conn()
        with lock:
            for i in range(0, len(ids), 500):
                part = ids[i:i + 500]
                rows = conn.execute(f"SELECT {SEARCH_COLUMNS} FROM searches WHERE query_id IN "
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
                                             "(?,?,?,?,?,?,?,?,?)", [event_row(e) for e in events])
                except BaseException:
                    self._events.execute("ROLLBACK")
                    raise
                self._events.execute("COMMIT")
                return self._events.total_changes - before
        except sqlite3.Error as e:
            raise StorageError(f"cannot store events in {self.path}: {e}") from e

    def read(self, since: float = 0.0, until: float | None = None) -> FeedbackSlice:
        until = time.time() + 1e9 if until is None else until
        conn, lock = self._read_conn()
        with lock:
            s = [search_from_row(r) for r in conn.execute(
                f"SELECT {SEARCH_COLUMNS} FROM searches WHERE ts >= ? AND ts < ? ORDER BY ts", (since, until))]
            e = [event_from_row(r) for r in conn.execute(
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
        conn, lock = self._read_conn()
        with lock:
            return {"searches": conn.execute("SELECT COUNT(*) FROM searches").fetchone()[0],
                    "events": conn.execute("SELECT COUNT(*) FROM events").fetchone()[0]}

    def popular_queries(self, since: float, min_users: int, limit: int,
                        bot_per_minute: int = 0) -> list[tuple[str, float]]:
        """Queries (as first typed) that shoppers clicked, added or bought from, by how many
        distinct users did; only queries with at least ``min_users`` such users (one shopper's
        searches are never suggested to others) and never one whose searches found nothing."""
        conn, lock = self._read_conn()
        with lock:
            rows = conn.execute(POPULAR_SQL.format(p="?", searches="searches", events="events"),
                                          (since, since, bot_per_minute or 10**9, min_users, limit)).fetchall()
        return [(str(t), float(n)) for t, n in rows]


def open_event_log(store: str | None, data_dir: str | os.PathLike[str], *, pool: object | None = None) -> EventLogAPI:
    """The feedback log beside a record store: ``events.sqlite`` in the data dir (SQLite), or
    tables in the PostgreSQL database (``pool``: the record store's connection pool). The
    PostgreSQL module is imported only when asked for (psycopg is an extra)."""
    if is_database_url(store):
        from vitrine.feedback.pgevents import PgEventLog

        return PgEventLog(str(store), pool=pool)
    return EventLog(Path(data_dir) / FILE)
