"""Merchandising rules in PostgreSQL (``vitrine_rules``): the rule store API replicas on many hosts
share. Same contract as :class:`~vitrine.merchandising.store.SqliteRuleStore`; writers take a
transaction-scoped advisory lock, so change numbers commit in order and a follower that loaded
everything up to number ``s`` never misses a later commit with a smaller one."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from vitrine.errors import InvalidInput
from vitrine.index.pgpool import connection, ensure_schema, open_pool, psycopg, scalar
from vitrine.merchandising.types import StoredRule, body_json, check_id, stored_rule, too_many

log = logging.getLogger(__name__)

R = "vitrine_rules"
_LOCK_ID = 0x72756C65  # "rule": writers of rules take turns
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {R} (
    id TEXT PRIMARY KEY,
    body TEXT,
    enabled BOOLEAN NOT NULL DEFAULT true,
    updated DOUBLE PRECISION NOT NULL,
    seq BIGINT NOT NULL,
    deleted BOOLEAN NOT NULL DEFAULT false
);
CREATE INDEX IF NOT EXISTS {R}_seq ON {R} (seq);
"""
_COLS = "id, body, enabled, updated, seq, deleted"
_UPSERT = f"""INSERT INTO {R} (id, body, enabled, updated, seq, deleted) VALUES (%s, %s, %s, %s, %s, false)
ON CONFLICT (id) DO UPDATE SET body=excluded.body, enabled=excluded.enabled, updated=excluded.updated,
  seq=excluded.seq, deleted=false"""


def _redact(url: str) -> str:
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "postgresql://?"
    return f"postgresql://{info.get('user', '')}@{info.get('host', 'localhost')}:{info.get('port', '5432')}/" \
           f"{info.get('dbname', '')}"


class PgRuleStore:
    """Rules in the shared PostgreSQL database (a small pool of its own)."""

    def __init__(self, url: str, *, timeout_s: float = 5.0) -> None:
        self.location = _redact(url)
        self.timeout_s = timeout_s
        self.pool = open_pool(url, name="vitrine-rules", max_size=2, timeout_s=timeout_s,
                              what=f"rule store {self.location}")
        try:
            with self._conn() as c:
                ensure_schema(c, _LOCK_ID, _SCHEMA)
        except BaseException:
            self.pool.close()
            raise

    def close(self) -> None:
        self.pool.close()

    def _conn(self) -> AbstractContextManager[psycopg.Connection]:
        return connection(self.pool, self.timeout_s, f"rule store {self.location}")

    @contextmanager
    def _tx(self) -> Iterator[psycopg.Connection]:
        with self._conn() as c, c.transaction():
            c.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_ID,))
            yield c

    @staticmethod
    def _next(c: psycopg.Connection) -> int:
        return int(scalar(c.execute(f"SELECT COALESCE(MAX(seq), 0) FROM {R}"))) + 1

    def version(self) -> int:
        with self._conn() as c:
            return int(scalar(c.execute(f"SELECT COALESCE(MAX(seq), 0) FROM {R}")))

    def changed_since(self, seq: int) -> list[StoredRule]:
        with self._conn() as c:
            rows = c.execute(f"SELECT {_COLS} FROM {R} WHERE seq > %s ORDER BY seq", (seq,)).fetchall()
        return [stored_rule(r) for r in rows]

    def put(self, rule_id: str, body: dict[str, Any], enabled: bool, *, max_rules: int | None = None) -> StoredRule:
        rid = check_id(rule_id)
        now = time.time()
        with self._tx() as c:
            if c.execute(f"SELECT 1 FROM {R} WHERE id=%s AND NOT deleted", (rid,)).fetchone() is None:
                too_many(int(scalar(c.execute(f"SELECT count(*) FROM {R} WHERE NOT deleted"))),
                         max_rules)
            seq = self._next(c)
            c.execute(_UPSERT, (rid, body_json(body), enabled, now, seq))
        return StoredRule(id=rid, body=body, enabled=enabled, updated=now, seq=seq)

    def put_many(self, rules: Sequence[tuple[str, dict[str, Any], bool]], *, max_rules: int | None = None) -> int:
        now = time.time()
        with self._tx() as c:
            seq = self._next(c) - 1
            params = []
            for rule_id, body, enabled in rules:
                seq += 1
                params.append((check_id(rule_id), body_json(body), enabled, now, seq))
            with c.cursor() as cur:
                cur.executemany(_UPSERT, params)
            n = int(scalar(c.execute(f"SELECT count(*) FROM {R} WHERE NOT deleted")))
            if max_rules is not None and n > max_rules:
                raise InvalidInput(f"rules: the import would hold {n} rules, over the configured {max_rules} "
                                   "(VITRINE_MAX_RULES)")
        return len(rules)

    def delete(self, rule_id: str) -> bool:
        with self._tx() as c:
            if c.execute(f"SELECT 1 FROM {R} WHERE id=%s AND NOT deleted", (rule_id,)).fetchone() is None:
                return False
            c.execute(f"UPDATE {R} SET deleted=true, body=NULL, seq=%s, updated=%s WHERE id=%s",
                      (self._next(c), time.time(), rule_id))
        return True

    def get(self, rule_id: str) -> StoredRule | None:
        with self._conn() as c:
            row = c.execute(f"SELECT {_COLS} FROM {R} WHERE id=%s AND NOT deleted", (rule_id,)).fetchone()
        return stored_rule(row) if row else None

    def all(self) -> list[StoredRule]:
        with self._conn() as c:
            rows = c.execute(f"SELECT {_COLS} FROM {R} WHERE NOT deleted ORDER BY id").fetchall()
        return [stored_rule(r) for r in rows]

    def count(self) -> int:
        with self._conn() as c:
            return int(scalar(c.execute(f"SELECT count(*) FROM {R} WHERE NOT deleted")))
