"""The rule store's table, the same for SQLite and PostgreSQL (vitrine/sqldb.py), its schema
version and the upgrades from older ones. ``rules`` in a data dir's ``records.sqlite`` (beside the
record store's tables), ``vitrine_rules`` in the shared PostgreSQL database.

Versions of the schema ``rules``:

1. one row per rule id: its JSON body, enabled, when written, its change number, a tombstone flag.
"""

from __future__ import annotations

import sqlalchemy as sa

from vitrine.sqldb import SqlDb, Upgrade

STORE = "rules"
VERSION = 1
UPGRADES: tuple[Upgrade, ...] = ()


def _table(name: str) -> sa.Table:
    return sa.Table(
        name, sa.MetaData(),
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("body", sa.Text),  # JSON; NULL in a tombstone
        sa.Column("enabled", sa.Boolean, nullable=False, server_default=sa.true()),
        sa.Column("updated", sa.Double, nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),  # the change number of its last write
        sa.Column("deleted", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Index(f"{name}_seq", "seq"),
    )


SQLITE_RULES = _table("rules")
POSTGRES_RULES = _table("vitrine_rules")


def rules_for(db: SqlDb) -> sa.Table:
    return POSTGRES_RULES if db.postgres else SQLITE_RULES


def ensure(db: SqlDb) -> int:
    """The rules table at :data:`VERSION` in ``db`` (made, or upgraded); the version found."""
    t = rules_for(db)
    return db.ensure_schema(STORE, t.metadata, VERSION, UPGRADES, legacy_table=t.name)
