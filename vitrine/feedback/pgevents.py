"""The feedback log in PostgreSQL: searches and events in the record store's database, shared by
API replicas on many hosts (same contract as :class:`~vitrine.feedback.eventlog.EventLog`)."""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager

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
from vitrine.feedback.types import EventRecord, FeedbackSlice, SearchLog, UserHasher
from vitrine.index.pgpool import (
    StorePool,
    connection,
    ensure_schema,
    open_pool,
    psycopg,
    scalar,
)

log = logging.getLogger(__name__)

S, E, M = "vitrine_searches", "vitrine_events", "vitrine_feedback_meta"
X, T = "vitrine_experiments", "vitrine_experiment_teams"  # experiments (vitrine/experiments/runner.py)
_LOCK_ID = 0x76697473
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {S} (
    query_id TEXT PRIMARY KEY, ts DOUBLE PRECISION NOT NULL, text TEXT, norm TEXT NOT NULL, ids TEXT NOT NULL,
    "offset" INTEGER NOT NULL DEFAULT 0, total INTEGER, image INTEGER NOT NULL DEFAULT 0,
    user_hash TEXT, session TEXT, experiment TEXT, variant TEXT, client TEXT, sort TEXT, filters TEXT
);
CREATE INDEX IF NOT EXISTS {S}_ts ON {S} (ts);
CREATE TABLE IF NOT EXISTS {E} (
    event_id TEXT PRIMARY KEY, query_id TEXT NOT NULL, type TEXT NOT NULL, product_id TEXT NOT NULL,
    position INTEGER NOT NULL, ts DOUBLE PRECISION NOT NULL, user_hash TEXT, session TEXT, client TEXT
);
ALTER TABLE {S} ADD COLUMN IF NOT EXISTS client TEXT;
ALTER TABLE {S} ADD COLUMN IF NOT EXISTS sort TEXT;
ALTER TABLE {S} ADD COLUMN IF NOT EXISTS filters TEXT;
ALTER TABLE {E} ADD COLUMN IF NOT EXISTS client TEXT;
CREATE INDEX IF NOT EXISTS {E}_ts ON {E} (ts);
CREATE INDEX IF NOT EXISTS {E}_query ON {E} (query_id);
CREATE TABLE IF NOT EXISTS {M} (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class PgEventLog:
    """Searches and events in PostgreSQL (see the module docstring). ``pool``: share the record
    store's connection pool (one per process), else a small one of its own."""

    def __init__(self, url: str, *, pool: object | None = None, timeout_s: float = 5.0) -> None:
        self.timeout_s = timeout_s
        self._own = not isinstance(pool, StorePool)
        self.pool = pool if isinstance(pool, StorePool) else \
            open_pool(url, name="vitrine-events", max_size=4, timeout_s=timeout_s, what="event log's database")
        with self._conn() as c:
            if ensure_schema(c, _LOCK_ID, _SCHEMA):
                c.execute(f"INSERT INTO {M} VALUES ('user_key', %s) ON CONFLICT DO NOTHING", (secrets.token_hex(32),))
            key = c.execute(f"SELECT value FROM {M} WHERE key='user_key'").fetchone()
        if key is None:
            raise StorageError("the event log's database (a read-only standby) has no feedback tables yet")
        self.hash_user = UserHasher(bytes.fromhex(key[0]))

    def _conn(self) -> AbstractContextManager[psycopg.Connection]:
        return connection(self.pool, self.timeout_s, "event log")

    def close(self) -> None:
        if self._own:
            self.pool.close()

    def get_meta(self, key: str) -> str | None:
        with self._conn() as c:
            row = c.execute(f"SELECT value FROM {M} WHERE key=%s", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        with self._conn() as c:
            c.execute(f"INSERT INTO {M} VALUES (%s, %s) ON CONFLICT (key) DO UPDATE SET value=excluded.value",
                      (key, value))

    def log_search(self, s: SearchLog) -> None:
        with self._conn() as c:
            c.execute(f"INSERT INTO {S} ({SEARCH_COLUMNS}) VALUES ({','.join(['%s'] * 15)}) "
                      "ON CONFLICT (query_id) DO NOTHING", search_row(s))

    def searches(self, query_ids: Sequence[str]) -> dict[str, SearchLog]:
        ids = list(dict.fromkeys(query_ids))
        if not ids:
            return {}
        with self._conn() as c:
            rows = c.execute(f"SELECT {SEARCH_COLUMNS} FROM {S} WHERE query_id = ANY(%s)", (ids,)).fetchall()
        return {r[0]: search_from_row(r) for r in rows}

    def add_events(self, events: Sequence[EventRecord]) -> int:
        if not events:
            return 0
        with self._conn() as c, c.transaction(), c.cursor() as cur:
            cur.executemany(f"INSERT INTO {E} ({EVENT_COLUMNS}) VALUES ({','.join(['%s'] * 9)}) "
                            "ON CONFLICT (event_id) DO NOTHING", [event_row(e) for e in events])
            return max(0, cur.rowcount)

    def read(self, since: float = 0.0, until: float | None = None) -> FeedbackSlice:
        until = time.time() + 1e9 if until is None else until
        with self._conn() as c:
            s = [search_from_row(r) for r in c.execute(
                f"SELECT {SEARCH_COLUMNS} FROM {S} WHERE ts >= %s AND ts < %s ORDER BY ts", (since, until))]
            e = [event_from_row(r) for r in c.execute(
                f"SELECT {EVENT_COLUMNS} FROM {E} WHERE ts >= %s AND ts < %s ORDER BY ts", (since, until))]
        return FeedbackSlice(s, e)

    def purge(self, before: float) -> int:
        with self._conn() as c, c.transaction():
            n = c.execute(f"DELETE FROM {E} WHERE ts < %s", (before,)).rowcount
            n += c.execute(f"DELETE FROM {S} WHERE ts < %s", (before,)).rowcount
        return n

    def popular_queries(self, since: float, min_users: int, limit: int,
                        bot_per_minute: int = 0) -> list[tuple[str, float]]:
        with self._conn() as c:
            rows = c.execute(POPULAR_SQL.format(p="%s", searches=S, events=E), (since, since, bot_per_minute or 10**9, min_users, limit)).fetchall()
        return [(str(t), float(n)) for t, n in rows]

    def counts(self) -> dict[str, int]:
        with self._conn() as c:
            return {"searches": scalar(c.execute(f"SELECT COUNT(*) FROM {S}")),
                    "events": scalar(c.execute(f"SELECT COUNT(*) FROM {E}"))}

    # -- analytics and experiments (the same queries as SQLite's: vitrine/feedback/event_sql.py) --------
    _SQL = analytics_sql(p="%s", bucket="CAST(FLOOR(ts / %s) AS BIGINT)", c='COLLATE "C"', searches=S, events=E)
    _BOTS = BOTS_SQL.format(p="%s", minute="CAST(FLOOR(ts / %s) AS BIGINT)", events=E)
    _UNITS = EXPERIMENT_UNITS_SQL.format(p="%s", c='COLLATE "C"', searches=S, events=E)
    _CLICKS = EXPERIMENT_CLICKS_SQL.format(p="%s", teams=T, events=E)

    def _ensure_experiment_tables(self) -> None:
        if getattr(self, "_exp_ready", False):
            return
        with self._conn() as c:
            if not scalar(c.execute("SELECT pg_is_in_recovery()")):
                with c.transaction():
                    c.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_ID,))
                    c.execute(EXPERIMENTS_SCHEMA.format(experiments=X, teams=T, searches=S, real="DOUBLE PRECISION"))
        self._exp_ready = True

    def experiment_searches(self, experiment: str, since: float, until: float
                            ) -> tuple[list[tuple[str, list[str], str | None]], list[tuple[str, str]]]:
        """An experiment's searches in a window (query_id, ids, variant) and the clicks on them."""
        args = (experiment, since, until)
        with self._conn() as c:
            rows = c.execute(EXPERIMENT_SEARCHES_SQL.format(p="%s", searches=S), args).fetchall()
            clicks = c.execute(EXPERIMENT_SEARCH_CLICKS_SQL.format(p="%s", searches=S, events=E), args).fetchall()
        return [(q, ids if isinstance(ids, list) else json.loads(ids), v) for q, ids, v in rows], \
            [(q, p) for q, p in clicks]

    def bots(self, since: float, until: float, per_minute: int) -> tuple[int, int]:
        """The clients the bot filter catches between two times, and their events there."""
        with self._conn() as c:
            row = c.execute(self._BOTS, bot_params(since, until, per_minute)).fetchone()
        return (int(row[0] or 0), int(row[1] or 0)) if row is not None else (0, 0)

    def aggregate(self, since: float, until: float, bucket_s: float, top: int) -> dict[str, list[tuple]]:
        with self._conn() as c:
            return analytics_rows(lambda q, params: c.execute(q, params).fetchall(), self._SQL, since, until,
                                  float(bucket_s), top)

    def save_experiment(self, name: str, spec: str, updated: float) -> None:
        self._ensure_experiment_tables()
        with self._conn() as c:
            c.execute(f"INSERT INTO {X} VALUES (%s, %s, %s) ON CONFLICT (name) DO UPDATE SET spec=excluded.spec, "
                      "updated=excluded.updated", (name, spec, updated))

    def experiment_specs(self) -> list[tuple[str, str, float]]:
        self._ensure_experiment_tables()
        with self._conn() as c:
            return [(r[0], r[1], float(r[2])) for r in c.execute(f"SELECT name, spec, updated FROM {X} ORDER BY name")]

    def log_teams(self, query_id: str, experiment: str, teams: str) -> None:
        self._ensure_experiment_tables()
        with self._conn() as c:
            c.execute(f"INSERT INTO {T} VALUES (%s, %s, %s) ON CONFLICT (query_id) DO UPDATE SET teams=excluded.teams",
                      (query_id, experiment, teams))

    def experiment_units(self, experiment: str, since: float = 0.0, until: float | None = None) -> list[tuple]:
        self._ensure_experiment_tables()
        with self._conn() as c:
            rows = c.execute(self._UNITS, (experiment, since, time.time() + 1e9 if until is None else until))
            return experiment_unit_rows(rows.fetchall())

    def interleaved_clicks(self, experiment: str, since: float = 0.0) -> list[tuple[str, str, str]]:
        self._ensure_experiment_tables()
        with self._conn() as c:
            return [tuple(r) for r in c.execute(self._CLICKS, (experiment, since))]
