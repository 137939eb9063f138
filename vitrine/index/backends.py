"""Which backend keeps the feedback log, the merchandising rules and the sessions of a data dir.

Each store has a SQLite implementation (the embedded default, in the data dir) and a PostgreSQL
one (when the record store is a ``postgresql://`` URL). The choice lives here, so that neither
implementation imports the other: the PostgreSQL modules are imported only when asked for
(psycopg is an extra).
"""

from __future__ import annotations

import os
from pathlib import Path

from vitrine.errors import InvalidInput
from vitrine.index.eventlog import FILE as EVENTS_FILE
from vitrine.index.event_types import EventLogAPI
from vitrine.index.eventlog import EventLog
from vitrine.index.rule_types import RuleStoreAPI
from vitrine.index.rulestore import SqliteRuleStore
from vitrine.index.session_types import SessionStoreAPI
from vitrine.index.sessionstore import MemorySessionStore, SqliteSessionStore
from vitrine.index.store import is_database_url


def open_event_log(store: str | None, data_dir: str | os.PathLike[str], *, pool: object | None = None) -> EventLogAPI:
    """The feedback log beside a record store: ``events.sqlite`` in the data dir (SQLite), or
    tables in the PostgreSQL database (``pool``: the record store's connection pool)."""
    if is_database_url(store):
        from vitrine.index.pgevents import PgEventLog  # psycopg is an extra

        return PgEventLog(str(store), pool=pool)
    return EventLog(Path(data_dir) / EVENTS_FILE)


def open_rule_store(store: str | None, data_dir: str | os.PathLike[str]) -> RuleStoreAPI:
    """The rule store beside a data dir's records: the SQLite file in it (``store`` empty), or the
    PostgreSQL database ``store`` names."""
    if is_database_url(store):
        from vitrine.index.pgrules import PgRuleStore  # psycopg is an extra

        return PgRuleStore(str(store))
    if store:
        raise InvalidInput(f"unknown record store {store!r}: give a postgresql://... URL, or none for SQLite")
    return SqliteRuleStore(Path(data_dir) / "records.sqlite")


def open_session_store(kind: str, *, data_dir: str | os.PathLike[str], database_url: str | None,
                       ttl_s: float, max_sessions: int) -> SessionStoreAPI:
    """The session store of a data dir: ``kind`` "memory" (this process), else the record store's
    home: PostgreSQL when ``database_url`` is given, else ``sessions.sqlite`` in ``data_dir``."""
    if kind == "memory":
        return MemorySessionStore(ttl_s, max_sessions)
    if database_url:
        from vitrine.index.pgsessions import PgSessionStore  # psycopg is an extra

        return PgSessionStore(database_url, ttl_s, max_sessions)
    return SqliteSessionStore(Path(data_dir) / "sessions.sqlite", ttl_s, max_sessions)
