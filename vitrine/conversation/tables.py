"""The session store's table, the same for SQLite and PostgreSQL (vitrine/sqldb.py), its schema
version and the upgrades from older ones. ``sessions`` in a data dir's ``sessions.sqlite``,
``vitrine_sessions`` in the shared PostgreSQL database.

Versions of the schema ``sessions``:

1. one row per session id: its state (JSON), its photo's query vector (float32 bytes), when
   last written.
2. ``version``: how many times the session was written (compare-and-swap writes: concurrent turns
   of one session never lose an update).
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from vitrine.sqldb import SqlDb, Upgrade, add_missing_columns

STORE = "sessions"
VERSION = 2


def _table(name: str) -> sa.Table:
    return sa.Table(
        name, sa.MetaData(),
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("state", sa.Text, nullable=False),  # JSON
        sa.Column("vec", sa.LargeBinary),  # float32 bytes of a photo's query vector
        sa.Column("touched", sa.Double, nullable=False),
        sa.Column("version", sa.Integer, nullable=False, server_default="0"),
        sa.Index(f"{name}_touched", "touched"),
    )


SQLITE_SESSIONS = _table("sessions")
POSTGRES_SESSIONS = _table("vitrine_sessions")


def sessions_for(db: SqlDb) -> sa.Table:
    return POSTGRES_SESSIONS if db.postgres else SQLITE_SESSIONS


def _v2(c: Connection, db: SqlDb) -> None:
    add_missing_columns(c, sessions_for(db), ("version",))


UPGRADES = (Upgrade(2, "a version per session (compare-and-swap writes)", _v2),)


def ensure(db: SqlDb) -> int:
    """The sessions table at :data:`VERSION` in ``db`` (made, or upgraded); the version found."""
    t = sessions_for(db)
    return db.ensure_schema(STORE, t.metadata, VERSION, UPGRADES, legacy_table=t.name)
