"""What the rule store (vitrine/merchandising/store.py, on SQLite or PostgreSQL) and its users
share: a rule as stored, the store's interface, and the checks every store
makes on a write.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from vitrine.errors import InvalidInput


@dataclass
class StoredRule:
    """One rule as stored: its body (conditions, consequences ...), whether it is on, when it was
    last written (seconds since the epoch), its change number, and whether it is a tombstone."""

    id: str
    body: dict[str, Any]
    enabled: bool
    updated: float
    seq: int
    deleted: bool = False


def body_json(body: dict[str, Any]) -> str:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def stored_rule(r: Sequence[Any]) -> StoredRule:
    """A StoredRule from ``id, body, enabled, updated, seq, deleted`` (both stores' column order)."""
    rid, body, enabled, updated, seq, deleted = r
    return StoredRule(id=rid, body=json.loads(body) if body else {}, enabled=bool(enabled), updated=float(updated),
                      seq=int(seq), deleted=bool(deleted))


@runtime_checkable
class RuleStoreAPI(Protocol):
    """Rules keyed by id, each write numbered (see the module docstring)."""

    location: str

    def version(self) -> int: ...

    def changed_since(self, seq: int) -> list[StoredRule]: ...

    def put(self, rule_id: str, body: dict[str, Any], enabled: bool, *, max_rules: int | None = None) -> StoredRule: ...

    def put_many(self, rules: Sequence[tuple[str, dict[str, Any], bool]], *, max_rules: int | None = None) -> int: ...

    def delete(self, rule_id: str) -> bool: ...

    def get(self, rule_id: str) -> StoredRule | None: ...

    def all(self) -> list[StoredRule]: ...

    def count(self) -> int: ...

    def close(self) -> None: ...


def check_id(rule_id: str) -> str:
    rid = rule_id.strip()
    if not rid or len(rid) > 200 or "/" in rid or any(ord(c) < 32 for c in rid):
        raise InvalidInput("rule_id: 1-200 characters, no '/' or control characters")
    return rid


def too_many(count: int, max_rules: int | None) -> None:
    if max_rules is not None and count >= max_rules:
        raise InvalidInput(f"rules: at most {max_rules} rules are configured (VITRINE_MAX_RULES); "
                           f"{count} are stored: delete some first")
