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
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from vitrine.errors import StorageError
from vitrine.sqlite import connect_wal

log = logging.getLogger(__name__)

EVENT_TYPES = ("view", "click", "add_to_cart", "purchase")
FILE = "events.sqlite"


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

    def popular_queries(self, since: float, min_users: int, limit: int) -> list[tuple[str, float]]: ...

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



# -- analytics and experiments (vitrine/search/analytics.py, vitrine/search/experiments.py) ---------
# Aggregations run in the store, so a report over millions of searches moves a few hundred rows.
# Every figure is an integer count (or a sum of integers) here; rates are divided in Python, so
# SQLite and PostgreSQL give the same figures for the same log. ``{p}``: the placeholder, ``{bucket}``:
# the time bucket of a search (whole ``bucket_s`` periods since the epoch, UTC), ``{c}``: a
# byte-order collation for ties (PostgreSQL's default collation sorts by locale).
_ANALYTICS_BASE = """
WITH s AS (
    SELECT query_id, norm, user_hash, {bucket} AS bucket,
           CASE WHEN total = 0 OR ids = '[]' THEN 1 ELSE 0 END AS nores
    FROM {searches} WHERE ts >= {p} AND ts < {p}),
f AS (
    SELECT e.query_id,
           MAX(CASE WHEN e.type = 'click' THEN 1 ELSE 0 END) AS clicked,
           MAX(CASE WHEN e.type = 'add_to_cart' THEN 1 ELSE 0 END) AS carted,
           MAX(CASE WHEN e.type = 'purchase' THEN 1 ELSE 0 END) AS bought,
           SUM(CASE WHEN e.type = 'click' THEN 1 ELSE 0 END) AS clicks,
           SUM(CASE WHEN e.type = 'click' THEN e.position ELSE 0 END) AS click_pos
    FROM {events} e JOIN s ON s.query_id = e.query_id GROUP BY e.query_id),
j AS (
    SELECT s.query_id, s.norm, s.user_hash, s.bucket, s.nores, COALESCE(f.clicked, 0) AS clicked,
           COALESCE(f.carted, 0) AS carted, COALESCE(f.bought, 0) AS bought, COALESCE(f.clicks, 0) AS clicks,
           COALESCE(f.click_pos, 0) AS click_pos
    FROM s LEFT JOIN f ON f.query_id = s.query_id)
"""
ANALYTICS_FIELDS = ("searches", "users", "no_results", "clicked", "carted", "bought", "clicks", "click_pos")
_AGG = ("COUNT(*), COUNT(DISTINCT user_hash), SUM(nores), SUM(clicked), SUM(carted), SUM(bought), SUM(clicks), "
        "SUM(click_pos)")
_ANALYTICS_QUERIES = {
    "totals": f"SELECT {_AGG}, COUNT(DISTINCT norm) FROM j",
    "buckets": f"SELECT bucket, {_AGG} FROM j GROUP BY bucket ORDER BY bucket",
    "queries": f"SELECT norm, {_AGG} FROM j GROUP BY norm ORDER BY COUNT(*) DESC, norm {{c}} LIMIT {{p}}",
    "no_results": "SELECT norm, COUNT(*), COUNT(DISTINCT user_hash) FROM j WHERE nores = 1 GROUP BY norm "
                  "ORDER BY COUNT(*) DESC, norm {c} LIMIT {p}",
    "no_clicks": "SELECT norm, COUNT(*), COUNT(DISTINCT user_hash) FROM j WHERE nores = 0 GROUP BY norm "
                 "HAVING SUM(clicked) = 0 ORDER BY COUNT(*) DESC, norm {c} LIMIT {p}",
}

# per experiment unit (the hashed user, else the session) and variant: searches, searches with a
# click / add-to-cart / purchase, and the sum over searches of 1 / (1 + the first click's rank)
EXPERIMENT_UNITS_SQL = """
WITH s AS (
    SELECT query_id, variant, COALESCE(user_hash, 'session:' || session) AS unit
    FROM {searches} WHERE experiment = {p} AND ts >= {p} AND ts < {p} AND (user_hash IS NOT NULL OR session IS NOT NULL)),
f AS (
    SELECT e.query_id,
           MAX(CASE WHEN e.type = 'click' THEN 1 ELSE 0 END) AS clicked,
           MAX(CASE WHEN e.type = 'add_to_cart' THEN 1 ELSE 0 END) AS carted,
           MAX(CASE WHEN e.type = 'purchase' THEN 1 ELSE 0 END) AS bought,
           MIN(CASE WHEN e.type = 'click' THEN e.position END) AS first_click
    FROM {events} e JOIN s ON s.query_id = e.query_id GROUP BY e.query_id)
SELECT s.variant, s.unit, COUNT(*), SUM(COALESCE(f.clicked, 0)), SUM(COALESCE(f.carted, 0)),
       SUM(COALESCE(f.bought, 0)),
       SUM(CASE WHEN f.first_click IS NULL THEN 0.0 ELSE 1.0 / (1 + f.first_click) END)
FROM s LEFT JOIN f ON f.query_id = s.query_id GROUP BY s.variant, s.unit ORDER BY s.variant, s.unit {c}
"""
EXPERIMENT_CLICKS_SQL = """
SELECT t.query_id, t.teams, e.product_id FROM {teams} t JOIN {events} e ON e.query_id = t.query_id
WHERE t.experiment = {p} AND e.type = 'click' AND e.ts >= {p} ORDER BY t.query_id, e.ts
"""
EXPERIMENTS_SCHEMA = """
CREATE TABLE IF NOT EXISTS {experiments} (name TEXT PRIMARY KEY, spec TEXT NOT NULL, updated {real} NOT NULL);
CREATE TABLE IF NOT EXISTS {teams} (query_id TEXT PRIMARY KEY, experiment TEXT NOT NULL, teams TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS {teams}_exp ON {teams} (experiment);
CREATE INDEX IF NOT EXISTS {searches}_exp ON {searches} (experiment);
"""


def analytics_sql(*, p: str, bucket: str, c: str, searches: str = "searches", events: str = "events") -> dict[str, str]:
    """The analytics queries in one SQL dialect (see the comment above ``_ANALYTICS_BASE``)."""
    base = _ANALYTICS_BASE.format(p=p, bucket=bucket, searches=searches, events=events)
    return {k: base + q.format(p=p, c=c) for k, q in _ANALYTICS_QUERIES.items()}


def _ints(row: Sequence) -> tuple:
    return tuple(int(v or 0) if not isinstance(v, str) else v for v in row)


def analytics_rows(run: Callable[[str, tuple], list[tuple]], sql: dict[str, str], since: float, until: float,
                   bucket_s: float, top: int) -> dict[str, list[tuple]]:
    """Run the analytics queries with ``run(sql, params)``; integer rows per query."""
    base = (bucket_s, since, until)
    out = {}
    for name, q in sql.items():
        rows = run(q, base if name in ("totals", "buckets") else (*base, top))
        out[name] = [_ints(r) for r in rows]
    return out


def experiment_unit_rows(rows: list[tuple]) -> list[tuple]:
    return [(v, u, int(n), int(c or 0), int(a or 0), int(b or 0), float(rr or 0.0)) for v, u, n, c, a, b, rr in rows]


class SqliteAnalytics:
    """The SQLite event log's analytics and experiment tables (a base of :class:`EventLog`)."""

    _SQL = analytics_sql(p="?", bucket="CAST(ts / ? AS INTEGER)", c="")
    _UNITS = EXPERIMENT_UNITS_SQL.format(p="?", c="", searches="searches", events="events")
    _CLICKS = EXPERIMENT_CLICKS_SQL.format(p="?", teams="experiment_teams", events="events")

    def _read_conn(self) -> tuple[sqlite3.Connection, threading.Lock]:
        return self._searches, self._search_lock  # type: ignore[attr-defined]

    def _ensure_experiment_tables(self) -> None:
        if getattr(self, "_exp_ready", False):
            return
        conn, lock = self._read_conn()
        with lock:
            conn.executescript(EXPERIMENTS_SCHEMA.format(experiments="experiments", teams="experiment_teams",
                                                          searches="searches", real="REAL"))
        self._exp_ready = True

    def aggregate(self, since: float, until: float, bucket_s: float, top: int) -> dict[str, list[tuple]]:
        """Analytics counts between two times (see :func:`analytics_sql`)."""
        conn, lock = self._read_conn()

        def run(q: str, params: tuple) -> list[tuple]:
            with lock:
                return conn.execute(q, params).fetchall()

        try:
            return analytics_rows(run, self._SQL, since, until, float(bucket_s), top)
        except sqlite3.Error as e:
            raise StorageError(f"cannot read analytics from {self.path}: {e}") from e  # type: ignore[attr-defined]

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


POPULAR_SQL = """
SELECT MIN(s.text), COUNT(DISTINCT COALESCE(e.user_hash, s.user_hash, s.query_id)) AS users
FROM {events} e JOIN {searches} s ON s.query_id = e.query_id
WHERE e.type IN ('click', 'add_to_cart', 'purchase') AND s.ts >= {p} AND s.norm <> '' AND s.text IS NOT NULL
  AND s.norm NOT IN (SELECT norm FROM {searches} WHERE total = 0 OR ids = '[]')
GROUP BY s.norm HAVING COUNT(DISTINCT COALESCE(e.user_hash, s.user_hash, s.query_id)) >= {p}
ORDER BY users DESC, MIN(s.text) LIMIT {p}
"""


class UserHasher:
    """HMAC-SHA256 of user tokens under one key per log (made once, kept in its meta table)."""

    def __init__(self, key: bytes) -> None:
        self.key = key

    def __call__(self, user: str | None) -> str | None:
        if not user:
            return None
        return hmac.new(self.key, user.encode(), hashlib.sha256).hexdigest()[:24]


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

    def popular_queries(self, since: float, min_users: int, limit: int) -> list[tuple[str, float]]:
        """Queries (as first typed) that shoppers clicked, added or bought from, by how many
        distinct users did; only queries with at least ``min_users`` such users (one shopper's
        searches are never suggested to others) and never one whose searches found nothing."""
        with self._search_lock:
            rows = self._searches.execute(POPULAR_SQL.format(p="?", searches="searches", events="events"),
                                          (since, min_users, limit)).fetchall()
        return [(str(t), float(n)) for t, n in rows]
