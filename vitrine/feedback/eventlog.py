"""Shopper feedback, durable: every search the API answered (what it showed) and the events on it.

Two tables, the same in both stores:

- ``searches``: one row per logged search: its ``query_id``, time, the query text and its
  normalised form, the page it showed (ids in rank order, from ``offset``), the experiment and
  variant that ranked it, the hashed user token and the session. Events name a search by its
  ``query_id``, so learning needs nothing else (vitrine/feedback/intake.py reads it back).
- ``events``: view, click, add_to_cart and purchase events, keyed by ``event_id`` (a client's own,
  or one made from the event's content), so a batch sent twice (an at-least-once Kafka consumer,
  a client retry) is stored once.

What its users share: vitrine/feedback/types.py (the records, the interface);
vitrine/feedback/event_sql.py holds the rows of a search and an event and the SQL of analytics,
experiments and popular searches.

SQLite: ``events.sqlite`` in the data dir (WAL; its own file, so a flood of
events never waits on the record store's writer); events commit with ``synchronous=FULL``: a 202
means on disk. PostgreSQL: the same tables (``vitrine_`` prefixed) in the record store's database,
for API replicas on many hosts. One class, :class:`EventLog`, speaks to both through SQLAlchemy
Core (vitrine/sqldb.py); its tables, schema version and upgrades: vitrine/feedback/tables.py.

User tokens are never stored: an HMAC of each with a key made once per log (kept in its meta
table), so one token is one user in analytics and experiments and cannot be read back.
"""

from __future__ import annotations
from __future__ import annotations

import json
import logging
import os
import secrets
import time
from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa

from vitrine.errors import StorageError
from vitrine.feedback import tables
from vitrine.feedback.event_sql import (
    BOTS_SQL,
    EXPERIMENT_CLICKS_SQL,
    EXPERIMENT_SEARCH_CLICKS_SQL,
    EXPERIMENT_SEARCHES_SQL,
    EXPERIMENT_UNITS_SQL,
    POPULAR_SQL,
    analytics_rows,
    analytics_sql,
    bot_params,
    event_from_row,
    event_row,
    experiment_unit_rows,
    search_from_row,
    search_row,
)
from vitrine.feedback.types import EventLogAPI, EventRecord, FeedbackSlice, SearchLog, UserHasher
from vitrine.index.store import is_database_url
from vitrine.sqldb import SqlDb

log = logging.getLogger(__name__)

FILE = "events.sqlite"


class EventLog:
    """The feedback log in ``target``: a SQLite file (a data dir's ``events.sqlite``) or a
    PostgreSQL URL (see the module docstring); its tables: vitrine/feedback/tables.py."""

    def __init__(self, target: str | os.PathLike[str], *, timeout_s: float = 5.0) -> None:
        self.postgres = is_database_url(str(target))
        self.path = None if self.postgres else Path(target)
        self.target = str(target)  # what another process opens to read and write the same log
        # SQLite: events FULL (a 202 means on disk); searches NORMAL (survives a killed process; a
        # search lost to a power cut only loses its events' context). PostgreSQL: one engine.
        self._db = SqlDb(target, what="event log", synchronous="FULL", timeout_s=timeout_s)
        self._search_db = self._db if self.postgres else SqlDb(target, what="event log", synchronous="NORMAL")
        try:
            tables.ensure(self._db)
        except BaseException:
            self.close()
            raise
        self.t = tables.tables_for(self._db)
        self.hash_user = UserHasher(self._user_key())
        p = self._db.placeholder
        names = {"searches": self.t.searches.name, "events": self.t.events.name}
        if self.postgres:
            self._sql = analytics_sql(p=p, bucket="CAST(FLOOR(s.ts / %s) AS BIGINT)", c='COLLATE "C"', **names)
            self._units = EXPERIMENT_UNITS_SQL.format(p=p, c='COLLATE "C"', **names)
            self._bots = BOTS_SQL.format(p=p, minute="CAST(FLOOR(ts / %s) AS BIGINT)", events=names["events"])
        else:
            self._sql = analytics_sql(p=p, bucket="CAST(s.ts / ? AS INTEGER)", c="", **names)
            self._units = EXPERIMENT_UNITS_SQL.format(p=p, c="", **names)
            self._bots = BOTS_SQL.format(p=p, minute="CAST(ts / ? AS INTEGER)", events=names["events"])
        self._exp_searches = EXPERIMENT_SEARCHES_SQL.format(p=p, searches=names["searches"])
        self._exp_search_clicks = EXPERIMENT_SEARCH_CLICKS_SQL.format(p=p, **names)
        self._clicks = EXPERIMENT_CLICKS_SQL.format(p=p, teams=self.t.teams.name, events=self.t.events.name)
        self._popular = POPULAR_SQL.format(p=p, **names)
        # the statements of the hot paths, built once (SQLAlchemy caches their compiled SQL)
        s, e = self.t.searches, self.t.events
        ins = self._db.insert(s)
        # PostgreSQL replicas never overwrite each other's searches; SQLite keeps the latest
        self._log_search = ins.on_conflict_do_nothing(index_elements=["query_id"]) if self.postgres \
            else ins.prefix_with("OR REPLACE")
        self._add_events = self._db.insert(e).on_conflict_do_nothing(index_elements=["event_id"]) \
            .returning(e.c.event_id)  # RETURNING names the rows inserted, not those already there
        self._by_ids = sa.select(s).where(s.c.query_id.in_(sa.bindparam("ids", expanding=True)))

    def _user_key(self) -> bytes:
        m = self.t.meta
        with self._db.tx(write=True) as c:
            if not self._db.read_only(c):
                c.execute(self._db.insert(m).values(key="user_key", value=secrets.token_hex(32))
                          .on_conflict_do_nothing(index_elements=["key"]))
            key = c.execute(sa.select(m.c.value).where(m.c.key == "user_key")).scalar()
        if key is None:
            raise StorageError("the event log's database (a read-only standby) has no feedback tables yet")
        return bytes.fromhex(key)

    def get_meta(self, key: str) -> str | None:
        m = self.t.meta
        with self._db.tx(single=True) as c:
            return c.execute(sa.select(m.c.value).where(m.c.key == key)).scalar()

    def set_meta(self, key: str, value: str) -> None:
        m = self.t.meta
        with self._db.tx(write=True) as c:
            c.execute(self._db.insert(m).values(key=key, value=value)
                      .on_conflict_do_update(index_elements=["key"], set_={"value": value}))

    def close(self) -> None:
        self._db.close()
        self._search_db.close()

    def log_search(self, s: SearchLog) -> None:
        with self._search_db.tx(write=True, single=True) as c:
            c.execute(self._log_search, search_row(s))

    def check_writable(self) -> None:
        """Raise StorageError at once if the log's database is known to be down: a search queued for
        the background writer then goes unlogged (no ``query_id``) instead of naming a search that
        will never be stored."""
        self._search_db.check()

    def log_searches(self, batch: Sequence[SearchLog]) -> None:
        """Log ``batch`` in one transaction (vitrine/feedback/logwriter.py writes this way)."""
        if batch:
            with self._search_db.tx(write=True) as c:
                c.execute(self._log_search, [search_row(s) for s in batch])

    def searches(self, query_ids: Sequence[str]) -> dict[str, SearchLog]:
        out: dict[str, SearchLog] = {}
        ids = list(dict.fromkeys(query_ids))
        with self._search_db.tx(single=True) as c:
            for i in range(0, len(ids), 500):
                rows = c.execute(self._by_ids, {"ids": ids[i:i + 500]}).all()
                out.update((r[0], search_from_row(r)) for r in rows)
        return out

    def add_events(self, events: Sequence[EventRecord]) -> int:
        """Store ``events`` in one transaction; returns how many were new (the rest were already
        stored: same ``event_id``)."""
        if not events:
            return 0
        with self._db.tx(write=True) as c:
            return len(c.execute(self._add_events, [event_row(e) for e in events]).all())

    def read(self, since: float = 0.0, until: float | None = None) -> FeedbackSlice:
        until = time.time() + 1e9 if until is None else until
        s, e = self.t.searches, self.t.events
        with self._search_db.tx() as c:
            searches = [search_from_row(r) for r in c.execute(
                sa.select(s).where(s.c.ts >= since, s.c.ts < until).order_by(s.c.ts))]
            evs = [event_from_row(r) for r in c.execute(
                sa.select(e).where(e.c.ts >= since, e.c.ts < until).order_by(e.c.ts))]
        return FeedbackSlice(searches, evs)

    def purge(self, before: float) -> int:
        """Forget searches and events older than ``before`` (retention); returns rows removed."""
        s, e = self.t.searches, self.t.events
        with self._db.tx(write=True) as c:
            n = c.execute(sa.delete(e).where(e.c.ts < before)).rowcount
            n += c.execute(sa.delete(s).where(s.c.ts < before)).rowcount
        return n

    def counts(self) -> dict[str, int]:
        with self._search_db.tx() as c:
            return {k: int(c.execute(sa.select(sa.func.count()).select_from(t)).scalar_one())
                    for k, t in (("searches", self.t.searches), ("events", self.t.events))}

    def popular_queries(self, since: float, min_users: int, limit: int,
                        bot_per_minute: int = 0) -> list[tuple[str, float]]:
        """Queries (as first typed) that shoppers clicked, added or bought from, by how many
        distinct users did; only queries with at least ``min_users`` such users (one shopper's
        searches are never suggested to others) and never one whose searches found nothing."""
        rows = self._search_db.rows(self._popular, (since, since, bot_per_minute or 10**9, min_users, limit))
        return [(str(t), float(n)) for t, n in rows]

    # -- analytics and experiments (vitrine/feedback/event_sql.py) ------------------------------
    def aggregate(self, since: float, until: float, bucket_s: float, top: int) -> dict[str, list[tuple]]:
        """Analytics counts between two times (see :func:`analytics_sql`)."""
        with self._search_db.tx() as c:
            return analytics_rows(lambda q, params: [tuple(r) for r in c.exec_driver_sql(q, params).fetchall()],
                                  self._sql, since, until, float(bucket_s), top)

    def bots(self, since: float, until: float, per_minute: int) -> tuple[int, int]:
        """The clients the bot filter catches between two times, and their events there."""
        rows = self._search_db.rows(self._bots, bot_params(since, until, per_minute))
        return (int(rows[0][0] or 0), int(rows[0][1] or 0)) if rows else (0, 0)

    def experiment_searches(self, experiment: str, since: float, until: float
                            ) -> tuple[list[tuple[str, list[str], str | None]], list[tuple[str, str]]]:
        """An experiment's searches in a window (query_id, ids, variant) and the clicks on them."""
        args = (experiment, since, until)
        rows = self._search_db.rows(self._exp_searches, args)
        clicks = self._search_db.rows(self._exp_search_clicks, args)
        return ([(str(q), ids if isinstance(ids, list) else json.loads(ids), v) for q, ids, v in rows],
                [(str(q), str(p)) for q, p in clicks])

    def save_experiment(self, name: str, spec: str, updated: float) -> None:
        """Create or replace one experiment (its spec: JSON text)."""
        with self._db.tx(write=True) as c:
            c.execute(self._db.insert(self.t.experiments).values(name=name, spec=spec, updated=updated)
                      .on_conflict_do_update(index_elements=["name"], set_={"spec": spec, "updated": updated}))

    def experiment_specs(self) -> list[tuple[str, str, float]]:
        """Every experiment: (name, spec JSON, updated)."""
        x = self.t.experiments
        with self._search_db.tx() as c:
            return [(r[0], r[1], float(r[2])) for r in c.execute(sa.select(x.c.name, x.c.spec, x.c.updated)
                                                                 .order_by(x.c.name))]

    def log_teams(self, query_id: str, experiment: str, teams: str) -> None:
        """Which variant (team) contributed each product of an interleaved search (JSON text)."""
        with self._search_db.tx(write=True) as c:
            c.execute(self._db.insert(self.t.teams).values(query_id=query_id, experiment=experiment, teams=teams)
                      .on_conflict_do_update(index_elements=["query_id"], set_={"teams": teams}))

    def experiment_units(self, experiment: str, since: float = 0.0, until: float | None = None) -> list[tuple]:
        """Per variant and unit (hashed user, else ``session:<id>``): (variant, unit, searches,
        clicked, carted, bought, sum of reciprocal first-click ranks)."""
        rows = self._search_db.rows(self._units, (experiment, since, time.time() + 1e9 if until is None else until))
        return experiment_unit_rows(rows)

    def interleaved_clicks(self, experiment: str, since: float = 0.0) -> list[tuple[str, str, str]]:
        """(query_id, teams JSON, clicked product id) of an interleaved experiment's searches."""
        return [(str(a), str(b), str(c)) for a, b, c in self._search_db.rows(self._clicks, (experiment, since))]


def open_event_log(store: str | None, data_dir: str | os.PathLike[str]) -> EventLogAPI:
    """The feedback log beside a record store: ``events.sqlite`` in the data dir (SQLite), or
    tables in the PostgreSQL database ``store`` names (psycopg, an extra, imported only then)."""
    if is_database_url(store):
        return EventLog(str(store))
    return EventLog(Path(data_dir) / FILE)
