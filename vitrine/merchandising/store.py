"""Merchandising rules as stored: one row per rule id, in the record store's database (the
SQLite file of a data dir, or the shared PostgreSQL), in a table of their own (``rules`` in SQLite,
``vitrine_rules`` in PostgreSQL: vitrine/merchandising/tables.py), through SQLAlchemy Core (vitrine/sqldb.py).

The store knows nothing of what a rule means (vitrine/merchandising/rules.py validates, matches and
applies them); it keeps each rule's JSON body with a change number:

- every write (put or delete) takes the next change number in one transaction that also
  serialises writers (SQLite's write lock, a PostgreSQL advisory lock), so the numbers commit in
  order and a follower that loaded everything up to number ``s`` never misses a later commit with
  a smaller one;
- a delete leaves a tombstone carrying its number;
- ``version()`` is the highest number (an indexed ``max``: a few microseconds), so every process
  that serves searches checks it cheaply and loads only the rules changed since
  (``changed_since``): that is how a rule reaches every worker and replica without a restart.

What both stores share (a rule as stored, the interface, the write checks) is
vitrine/merchandising/types.py.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from vitrine.errors import InvalidInput
from vitrine.index.store import is_database_url
from vitrine.merchandising import tables
from vitrine.merchandising.types import RuleStoreAPI, StoredRule, body_json, check_id, stored_rule, too_many
from vitrine.sqldb import SqlDb

_LOCK_ID = 0x72756C65  # "rule": PostgreSQL writers of rules take turns


class RuleStore:
    """Rules in ``target``: a SQLite file (the data dir's ``records.sqlite``) or a PostgreSQL URL."""

    def __init__(self, target: str | os.PathLike[str], *, timeout_s: float = 5.0) -> None:
        self._db = SqlDb(target, what="rule store", synchronous="FULL", timeout_s=timeout_s)
        self.location = self._db.location
        try:
            tables.ensure(self._db)
        except BaseException:
            self._db.close()
            raise
        self.t = tables.rules_for(self._db)
        t = self.t
        self._cols = (t.c.id, t.c.body, t.c.enabled, t.c.updated, t.c.seq, t.c.deleted)
        self._max_seq = sa.select(sa.func.coalesce(sa.func.max(t.c.seq), 0))
        self._live = sa.select(sa.func.count()).select_from(t).where(t.c.deleted == sa.false())

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[Connection]:
        with self._db.tx(write=True) as c:
            if self._db.postgres:
                c.exec_driver_sql("SELECT pg_advisory_xact_lock(%s)", (_LOCK_ID,))
            yield c

    def _upsert(self, rid: str, body: dict[str, Any], enabled: bool, now: float, seq: int) -> Any:
        row = {"id": rid, "body": body_json(body), "enabled": enabled, "updated": now, "seq": seq, "deleted": False}
        ins = self._db.insert(self.t).values(row)
        return ins.on_conflict_do_update(index_elements=["id"], set_={k: v for k, v in row.items() if k != "id"})

    def _exists(self, c: Connection, rid: str) -> bool:
        t = self.t
        return c.execute(sa.select(t.c.id).where(t.c.id == rid, t.c.deleted == sa.false())).first() is not None

    def version(self) -> int:
        with self._db.tx(single=True) as c:
            return int(c.execute(self._max_seq).scalar_one())

    def changed_since(self, seq: int) -> list[StoredRule]:
        """Rules written or deleted after change ``seq`` (tombstones included), in change order."""
        with self._db.tx(single=True) as c:
            rows = c.execute(sa.select(*self._cols).where(self.t.c.seq > seq).order_by(self.t.c.seq)).all()
        return [stored_rule(r) for r in rows]

    def put(self, rule_id: str, body: dict[str, Any], enabled: bool, *, max_rules: int | None = None) -> StoredRule:
        """Create or replace a rule; refused past ``max_rules`` live rules (a replacement always fits)."""
        rid = check_id(rule_id)
        now = time.time()
        with self._tx() as c:
            if not self._exists(c, rid):
                too_many(int(c.execute(self._live).scalar_one()), max_rules)
            seq = int(c.execute(self._max_seq).scalar_one()) + 1
            c.execute(self._upsert(rid, body, enabled, now, seq))
        return StoredRule(id=rid, body=body, enabled=enabled, updated=now, seq=seq)

    def put_many(self, rules: Sequence[tuple[str, dict[str, Any], bool]], *, max_rules: int | None = None) -> int:
        """Create or replace many rules in one transaction (an import); returns how many."""
        now = time.time()
        with self._tx() as c:
            seq = int(c.execute(self._max_seq).scalar_one())
            for rule_id, body, enabled in rules:
                seq += 1
                c.execute(self._upsert(check_id(rule_id), body, enabled, now, seq))
            n = int(c.execute(self._live).scalar_one())
            if max_rules is not None and n > max_rules:
                raise InvalidInput(f"rules: the import would hold {n} rules, over the configured {max_rules} "
                                   "(VITRINE_MAX_RULES)")
        return len(rules)

    def delete(self, rule_id: str) -> bool:
        with self._tx() as c:
            if not self._exists(c, rule_id):
                return False
            seq = int(c.execute(self._max_seq).scalar_one()) + 1
            c.execute(sa.update(self.t).where(self.t.c.id == rule_id)
                      .values(deleted=True, body=None, seq=seq, updated=time.time()))
        return True

    def get(self, rule_id: str) -> StoredRule | None:
        t = self.t
        with self._db.tx(single=True) as c:
            row = c.execute(sa.select(*self._cols).where(t.c.id == rule_id, t.c.deleted == sa.false())).first()
        return stored_rule(row) if row else None

    def all(self) -> list[StoredRule]:
        t = self.t
        with self._db.tx(single=True) as c:
            rows = c.execute(sa.select(*self._cols).where(t.c.deleted == sa.false()).order_by(t.c.id)).all()
        return [stored_rule(r) for r in rows]

    def count(self) -> int:
        with self._db.tx(single=True) as c:
            return int(c.execute(self._live).scalar_one())


def open_rule_store(store: str | None, data_dir: str | os.PathLike[str]) -> RuleStoreAPI:
    """The rule store beside a data dir's records: the SQLite file in it (``store`` empty), or the
    PostgreSQL database ``store`` names (psycopg, an extra)."""
    if is_database_url(store):
        return RuleStore(str(store))
    if store:
        raise InvalidInput(f"unknown record store {store!r}: give a postgresql://... URL, or none for SQLite")
    return RuleStore(Path(data_dir) / "records.sqlite")
