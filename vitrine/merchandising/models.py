"""Merchandising rules as the API and `vitrine rules` take them (docs/merchandising.md): the
conditions and consequences of a rule, validated (:class:`Rule`, :func:`check_rule`), and rules
exported and read back (:func:`dump_rules`, :func:`parse_rules`). How rules apply to a search is
vitrine/merchandising/rules.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from vitrine.errors import InvalidInput
from vitrine.index.querytext import CJK, normalise_query
from vitrine.index.store import RecordStoreAPI
from vitrine.search.models import Filters

IntentLabel = Literal["search", "compare", "recommend", "purchase_intent", "after_sales", "abandon"]
OutOfStock = Literal["last", "hide", "show"]


# -- normalised words ---------------------------------------------------------------------------------
_CJK_CHAR = re.compile(f"[{CJK}]")


def normalise(text: str | None) -> str:
    """A query as rules compare it: the one normal form of a query (vitrine/index/querytext.py)."""
    return normalise_query(text)


def has_cjk(text: str) -> bool:
    return _CJK_CHAR.search(text) is not None


# -- the rule as the API takes it -------------------------------------------------------------------------
class QueryCondition(BaseModel):
    """``{"is": "summer dress"}`` or ``{"contains": "dress"}``."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    is_: str | None = Field(None, alias="is", max_length=1000, description="The whole query, normalised")
    contains: str | None = Field(None, max_length=1000, description="Words the query holds, in this order "
                                                                    "(CJK: a substring)")

    @model_validator(mode="after")
    def _one(self) -> QueryCondition:
        if (self.is_ is None) == (self.contains is None):
            raise ValueError('give exactly one of "is" or "contains"')
        if not normalise(self.is_ if self.is_ is not None else self.contains):
            raise ValueError("the query condition has no words")
        return self


class Conditions(BaseModel):
    """When a rule fires: every condition given must hold (none given: every search)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    query: QueryCondition | None = None
    category: str | list[str] | None = Field(None, description="A category the search filters on (any of these)")
    intent: IntentLabel | list[IntentLabel] | None = Field(None, description="The query's intent (any of these)")
    variant: str | None = Field(None, min_length=1, max_length=64, description=(
        "Only searches in this experiment variant (a variant can be a rule set)"))
    from_: datetime | None = Field(None, alias="from", description="Campaign start (ISO 8601 or epoch seconds; "
                                                                    "UTC when no zone is given)")
    until: datetime | None = Field(None, description="Campaign end (exclusive)")

    @field_validator("from_", "until")
    @classmethod
    def _utc(cls, v: datetime | None) -> datetime | None:
        return v.replace(tzinfo=UTC) if v is not None and v.tzinfo is None else v

    @field_validator("until")
    @classmethod
    def _after(cls, v: datetime | None, info: Any) -> datetime | None:
        start = info.data.get("from_")
        if v is not None and start is not None and v <= start:
            raise ValueError("until must be after from")
        return v


class Pin(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, max_length=256, description="A product id")
    position: int = Field(0, ge=0, description="0: first result of the relevance order (below max_k)")


class Boost(BaseModel):
    """The products ``filter`` matches move up (boost) or down (bury) by ``weight`` times the
    query's top score."""

    model_config = ConfigDict(extra="forbid")

    filter: Filters
    weight: float = Field(0.1, gt=0, le=100)

    @field_validator("filter")
    @classmethod
    def _some(cls, v: Filters) -> Filters:
        if v.is_empty():
            raise ValueError("the filter names no field")
        return v


class Consequences(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pin: list[Pin] = Field(default_factory=list, max_length=100)
    boost: list[Boost] = Field(default_factory=list, max_length=50)
    bury: list[Boost] = Field(default_factory=list, max_length=50)
    hide: list[str] = Field(default_factory=list, max_length=10_000, description="Product ids left out")
    filters: Filters | None = Field(None, description="Only products these filters allow")
    banner: dict[str, Any] | None = Field(None, description="Anything the storefront shows above the results")
    redirect: str | None = Field(None, max_length=2048, description="An http(s) URL or a path (/...)")
    out_of_stock: OutOfStock | None = Field(None, description="last, hide or show, for this query")

    @field_validator("redirect")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None and not (v.startswith(("http://", "https://")) or (v.startswith("/") and
                                                                           not v.startswith("//"))):
            raise ValueError("redirect must be an http(s) URL or a path starting with /")
        return v

    @field_validator("hide")
    @classmethod
    def _ids(cls, v: list[str]) -> list[str]:
        if any(not isinstance(x, str) or not x.strip() for x in v):
            raise ValueError("hide takes product ids")
        return v


class Rule(BaseModel):
    """A merchandising rule (the body of ``PUT /v1/rules/{rule_id}``)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"conditions": {"query": {"is": "summer dress"}},
         "consequences": {"pin": [{"id": "15970", "position": 0}],
                          "boost": [{"filter": {"brand": "Puma"}, "weight": 0.2}], "hide": ["2133"]},
         "enabled": True},
        {"conditions": {"query": {"contains": "shoes"}, "from": "2026-07-03T00:00:00Z",
                        "until": "2026-07-07T00:00:00Z"},
         "consequences": {"banner": {"text": "Weekend sale: shoes -20%"}, "bury": [{"filter": {"brand": "Nike"}}]}},
    ]})

    conditions: Conditions = Field(default_factory=Conditions)
    consequences: Consequences
    enabled: bool = True
    priority: int = Field(0, ge=-1_000_000, le=1_000_000, description=(
        "Precedence among the rules that hold for a search: higher wins a contested pin position, "
        "banner, redirect or out_of_stock; equal priorities: an exact query before contains before "
        "the rest, then by id"))
    description: str | None = Field(None, max_length=1000)

    def body(self) -> dict[str, Any]:
        """As stored (``enabled`` has its own column)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True, exclude={"enabled"})


class RuleOut(Rule):
    id: str
    updated: datetime = Field(description="Last written")
    active: bool = Field(description="Enabled and within its campaign window now")
    warnings: list[str] | None = Field(None, description=(
        "On a write: what in the rule matches nothing now (a filter no product matches, such as a "
        "brand no product has); the rule is stored all the same"))


def check_rule(rule: Rule, records: RecordStoreAPI, max_k: int) -> None:
    """The checks a rule's shape cannot say: pinned products exist in ``records``, positions are
    below ``max_k``. InvalidInput names the field."""
    pins = rule.consequences.pin
    for j, p in enumerate(pins):
        if p.position >= max_k:
            raise InvalidInput(f"consequences.pin[{j}].position: {p.position} is beyond max_k ({max_k}); "
                               f"positions run from 0 to {max_k - 1}")
    if pins:
        have = records.get_many([p.id for p in pins])
        for j, p in enumerate(pins):
            if p.id not in have:
                raise InvalidInput(f"consequences.pin[{j}].id: unknown product {p.id!r}")


def dump_rules(rules: Iterable[RuleOut]) -> list[dict[str, Any]]:
    """Rules as `vitrine rules export` writes them (one JSON object per line: id + rule)."""
    return [{"id": r.id, **Rule.model_validate(r.model_dump(by_alias=True, include={
        "conditions", "consequences", "enabled", "priority", "description"})).body(), "enabled": r.enabled}
        for r in rules]


def parse_rules(items: Iterable[Mapping[str, Any]]) -> list[tuple[str, Rule]]:
    """Exported rules (id + rule per object) read back; InvalidInput names the bad one's field."""
    out = []
    for n, item in enumerate(items, 1):
        body = dict(item)
        rid = str(body.pop("id", "") or "")
        if not rid:
            raise InvalidInput(f"rule {n}: id is required")
        try:
            out.append((rid, Rule.model_validate(body)))
        except ValidationError as e:
            err = e.errors()[0]
            raise InvalidInput(f"rule {rid!r}: {'.'.join(str(x) for x in err['loc'])}: {err['msg']}") from e
    return out
