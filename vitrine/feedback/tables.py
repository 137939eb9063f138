"""The feedback log's tables, the same for SQLite and PostgreSQL (vitrine/sqldb.py), its schema
version and the upgrades from older ones.

Names: a data dir's ``events.sqlite`` has ``searches``, ``events``, ``meta``, ``experiments`` and
``experiment_teams``; in the shared PostgreSQL database, where other stores live beside them,
they carry a ``vitrine_`` prefix (``vitrine_feedback_meta`` for the meta table).

Versions of the schema ``feedback``:

1. searches, events and meta (the first release; the experiment tables were made on first use).
2. ``client`` on searches and events, ``sort`` and ``filters`` on searches (issue 53); the
   experiment tables made with the others.
3. Covering indexes for the aggregations (analytics, the bot filter): events by
   ``(query_id, type, position)`` and by ``(ts, client)``, replacing those on ``query_id`` and on
   ``ts`` alone (prefixes of them), so a report reads indexes only, never the events' rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from vitrine.sqldb import SqlDb, Upgrade, add_missing_columns

STORE = "feedback"
VERSION = 3


@dataclass(frozen=True)
class FeedbackTables:
    metadata: sa.MetaData
    searches: sa.Table
    events: sa.Table
    meta: sa.Table
    experiments: sa.Table
    teams: sa.Table


def _tables(prefix: str, meta_name: str) -> FeedbackTables:
    m = sa.MetaData()
    s = f"{prefix}searches"
    searches = sa.Table(
        s, m,
        sa.Column("query_id", sa.Text, primary_key=True),
        sa.Column("ts", sa.Double, nullable=False),
        sa.Column("text", sa.Text),
        sa.Column("norm", sa.Text, nullable=False),
        sa.Column("ids", sa.Text, nullable=False),  # JSON: the page shown, in rank order
        sa.Column("offset", sa.Integer, nullable=False, server_default="0"),
        sa.Column("total", sa.Integer),
        sa.Column("image", sa.Integer, nullable=False, server_default="0"),
        sa.Column("user_hash", sa.Text),
        sa.Column("session", sa.Text),
        sa.Column("experiment", sa.Text),
        sa.Column("variant", sa.Text),
        sa.Column("client", sa.Text),  # version 2
        sa.Column("sort", sa.Text),  # version 2
        sa.Column("filters", sa.Text),  # version 2
        sa.Index(f"{s}_ts", "ts"),
        sa.Index(f"{s}_exp", "experiment"),
    )
    e = f"{prefix}events"
    events = sa.Table(
        e, m,
        sa.Column("event_id", sa.Text, primary_key=True),
        sa.Column("query_id", sa.Text, nullable=False),
        sa.Column("type", sa.Text, nullable=False),
        sa.Column("product_id", sa.Text, nullable=False),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("ts", sa.Double, nullable=False),
        sa.Column("user_hash", sa.Text),
        sa.Column("session", sa.Text),
        sa.Column("client", sa.Text),  # version 2
        sa.Index(f"{e}_ts_client", "ts", "client"),  # version 3 (before: ts alone)
        sa.Index(f"{e}_query_type", "query_id", "type", "position"),  # version 3 (before: query_id alone)
    )
    meta = sa.Table(meta_name, m, sa.Column("key", sa.Text, primary_key=True),
                    sa.Column("value", sa.Text, nullable=False))
    experiments = sa.Table(f"{prefix}experiments", m, sa.Column("name", sa.Text, primary_key=True),
                           sa.Column("spec", sa.Text, nullable=False), sa.Column("updated", sa.Double, nullable=False))
    t = f"{prefix}experiment_teams"
    teams = sa.Table(t, m, sa.Column("query_id", sa.Text, primary_key=True),
                     sa.Column("experiment", sa.Text, nullable=False), sa.Column("teams", sa.Text, nullable=False),
                     sa.Index(f"{t}_exp", "experiment"))
    return FeedbackTables(m, searches, events, meta, experiments, teams)


SQLITE_TABLES = _tables("", "meta")
POSTGRES_TABLES = _tables("vitrine_", "vitrine_feedback_meta")


def tables_for(db: SqlDb) -> FeedbackTables:
    return POSTGRES_TABLES if db.postgres else SQLITE_TABLES


def _v2(c: Connection, db: SqlDb) -> None:
    t = tables_for(db)
    add_missing_columns(c, t.searches, ("client", "sort", "filters"))
    add_missing_columns(c, t.events, ("client",))


def _v3(c: Connection, db: SqlDb) -> None:
    t = tables_for(db)
    for index in t.events.indexes:
        index.create(c, checkfirst=True)
    for old in ("query", "ts"):
        c.execute(sa.text(f"DROP INDEX IF EXISTS {t.events.name}_{old}"))


UPGRADES = (Upgrade(2, "client, sort and filters columns on searches and events", _v2),
            Upgrade(3, "covering indexes on events for analytics and the bot filter", _v3))


def ensure(db: SqlDb) -> int:
    """The feedback tables at :data:`VERSION` in ``db`` (made, or upgraded); the version found."""
    t = tables_for(db)
    return db.ensure_schema(STORE, t.metadata, VERSION, UPGRADES, legacy_table=t.searches.name)
