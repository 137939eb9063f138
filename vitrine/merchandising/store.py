"""Merchandising rules as stored: one row per rule id, in the record store's database (the
SQLite file of a data dir, or the shared PostgreSQL: vitrine/merchandising/pgstore.py), in tables of
their own (``rules`` here, ``vitrine_rules`` there).

The store knows nothing of what a rule means (vitrine/merchandising/rules.py validates, matches and
applies them); it keeps each rule's JSON body with a change number:

- every write (put or delete) takes the next change number in one transaction that also
  serialises writers, so the numbers commit in order;
- a delete leaves a tombstone carrying its number;
- ``version()`` is the highest number (an indexed ``max``: a few microseconds), so every process
  that serves searches checks it cheaply and loads only the rules changed since
  (``changed_since``): that is how a rule reaches every worker and replica without a restart.

What both stores share (a rule as stored, the interface, the write checks) is
vitrine/merchandising/types.py.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from vitrine.errors import InvalidInput, StorageError
from vitrine.sqlite import connect_wal
from vitrine.index.store import is_database_url
from vitrine.merchandising.types import RuleStoreAPI, StoredRule, body_json, check_id, stored_rule, too_many

_SCHEMA = """
CREATE TABLE IF NOT EXISTS rules (
    id TEXT PRIMARY KEY,
    body TEXT,
    enabled INTEGER NOT NULL DEFAULT 1,
    updated REAL NOT NULL,
    seq INTEGER NOT NULL,
    deleted INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS rules_seq ON rules(seq);
"""


class SqliteRuleStore:
    """Rules in a SQLite file (the data dir's ``records.sqlite``: the record store's file, its own table)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.location = str(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        try:
            self._conn = connect_wal(self.path, synchronous="FULL", check_same_thread=False, isolation_level=None)
            self._conn.executescript(_SCHEMA)
        except sqlite3.DatabaseError as e:
            raise StorageError(f"cannot open the rule store {self.path}: {e}") from e

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as e:
                raise StorageError(f"rule store {self.path}: {e}") from e
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def _query(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        try:
            with self._lock:
                return self._conn.execute(sql, args).fetchall()
        except sqlite3.Error as e:
            raise StorageError(f"rule store {self.path}: {e}") from e

    def version(self) -> int:
        return int(self._query("SELECT COALESCE(MAX(seq), 0) FROM rules")[0][0])

    _COLS = "id, body, enabled, updated, seq, deleted"

    def changed_since(self, seq: int) -> list[StoredRule]:
        """Rules written or deleted after change ``seq`` (tombstones included), in change order."""
        return [stored_rule(r) for r in self._query(f"SELECT {self._COLS} FROM rules WHERE seq > ? ORDER BY seq",
                                                    (seq,))]

    def put(self, rule_id: str, body: dict[str, Any], enabled: bool, *, max_rules: int | None = None) -> StoredRule:
        """Create or replace a rule; refused past ``max_rules`` live rules (a replacement always fits)."""
        rid = check_id(rule_id)
        now = time.time()
        with self._tx() as c:
            exists = c.execute("SELECT 1 FROM rules WHERE id=? AND deleted=0", (rid,)).fetchone()
            if exists is None:
                too_many(int(c.execute("SELECT COUNT(*) FROM rules WHERE deleted=0").fetchone()[0]), max_rules)
            seq = int(c.execute("SELECT COALESCE(MAX(seq), 0) FROM rules").fetchone()[0]) + 1
            c.execute("""INSERT INTO rules (id, body, enabled, updated, seq, deleted) VALUES (?, ?, ?, ?, ?, 0)
                         ON CONFLICT(id) DO UPDATE SET body=excluded.body, enabled=excluded.enabled,
                           updated=excluded.updated, seq=excluded.seq, deleted=0""",
                      (rid, body_json(body), int(enabled), now, seq))
        return StoredRule(id=rid, body=body, enabled=enabled, updated=now, seq=seq)

    def put_many(self, rules: Sequence[tuple[str, dict[str, Any], bool]], *, max_rules: int | None = None) -> int:
        """Create or replace many rules in one transaction (an import); returns how many."""
        now = time.time()
        with self._tx() as c:
            seq = int(c.execute("SELECT COALESCE(MAX(seq), 0) FROM rules").fetchone()[0])
            for rule_id, body, enabled in rules:
                seq += 1
                c.execute("""INSERT INTO rules (id, body, enabled, updated, seq, deleted) VALUES (?, ?, ?, ?, ?, 0)
                             ON CONFLICT(id) DO UPDATE SET body=excluded.body, enabled=excluded.enabled,
                               updated=excluded.updated, seq=excluded.seq, deleted=0""",
                          (check_id(rule_id), body_json(body), int(enabled), now, seq))
            n = int(c.execute("SELECT COUNT(*) FROM rules WHERE deleted=0").fetchone()[0])
            if max_rules is not None and n > max_rules:
                raise InvalidInput(f"rules: the import would hold {n} rules, over the configured {max_rules} "
                                   "(VITRINE_MAX_RULES)")
        return len(rules)

    def delete(self, rule_id: str) -> bool:
        with self._tx() as c:
            if c.execute("SELECT 1 FROM rules WHERE id=? AND deleted=0", (rule_id,)).fetchone() is None:
                return False
            seq = int(c.execute("SELECT COALESCE(MAX(seq), 0) FROM rules").fetchone()[0]) + 1
            c.execute("UPDATE rules SET deleted=1, body=NULL, seq=?, updated=? WHERE id=?", (seq, time.time(), rule_id))
        return True

    def get(self, rule_id: str) -> StoredRule | None:
        rows = self._query(f"SELECT {self._COLS} FROM rules WHERE id=? AND deleted=0", (rule_id,))
        return stored_rule(rows[0]) if rows else None

    def all(self) -> list[StoredRule]:
        return [stored_rule(r) for r in self._query(f"SELECT {self._COLS} FROM rules WHERE deleted=0 ORDER BY id")]

    def count(self) -> int:
        return int(self._query("SELECT COUNT(*) FROM rules WHERE deleted=0")[0][0])


def open_rule_store(store: str | None, data_dir: str | os.PathLike[str]) -> RuleStoreAPI:
    """The rule store beside a data dir's records: the SQLite file in it (``store`` empty), or the
    PostgreSQL database ``store`` names (psycopg, an extra, imported only then)."""
    if is_database_url(store):
        from vitrine.merchandising.pgstore import PgRuleStore

        return PgRuleStore(str(store))
    if store:
        raise InvalidInput(f"unknown record store {store!r}: give a postgresql://... URL, or none for SQLite")
    return SqliteRuleStore(Path(data_dir) / "records.sqlite")
