"""Merchandising rules (docs/merchandising.md): read and write them with the API key (a rule can
hold a future campaign or the products a shop hides, so listing them is an admin read).
Applied to every search of every process within ``rules_refresh_s`` (vitrine/merchandising/rules.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from vitrine.merchandising.models import Rule, RuleOut
from vitrine.web.deps import EngineDep, KeyRequired
from vitrine.web.errors import errors_for

router = APIRouter(prefix="/rules", tags=["rules"])


@router.get("", response_model=list[RuleOut], response_model_exclude_none=True, dependencies=[KeyRequired],
            responses=errors_for(401))
def list_rules(engine: EngineDep) -> list[RuleOut]:
    """Every stored rule, by id (needs X-API-Key)."""
    return engine.rules.list()


@router.get("/{rule_id}", response_model=RuleOut, response_model_exclude_none=True, dependencies=[KeyRequired],
            responses=errors_for(401, 404))
def get_rule(rule_id: str, engine: EngineDep) -> RuleOut:
    """One rule by id (needs X-API-Key)."""
    return engine.rules.get(rule_id)


@router.put("/{rule_id}", response_model=RuleOut, response_model_exclude_none=True, dependencies=[KeyRequired],
            responses=errors_for(401))
def put_rule(rule_id: str, rule: Rule, engine: EngineDep) -> RuleOut:
    """Create or replace a rule (needs X-API-Key). 422 names the field of a bad rule: an unknown
    product in a pin, a position beyond max_k, an unknown filter field, `until` before `from`, or
    more rules than the configured maximum. A filter (boost, bury, filters) that matches no product
    is accepted, and ``warnings`` in the answer says so (a brand no product has, a misspelt value)."""
    return engine.rules.put(rule_id, rule)


@router.delete("/{rule_id}", dependencies=[KeyRequired], responses=errors_for(
    401, 404, ok={"id": "summer-dress", "deleted": True}))
def delete_rule(rule_id: str, engine: EngineDep) -> dict[str, Any]:
    """Delete a rule (needs X-API-Key)."""
    engine.rules.delete(rule_id)
    return {"id": rule_id, "deleted": True}
