"""Catalogue change events (docs/design.md): what travels on the Kafka topic, validated with pydantic.

Two shapes, JSON values keyed by the product id (so one product's events stay ordered on one
partition)::

    {"op": "upsert", "product": {...catalogue record...}, "version": 7}
    {"op": "delete", "id": "15970", "version": 8}

``version`` is optional: any non-decreasing integer the source owns (a revision counter, or an
updated-at timestamp in milliseconds). An event older than what the index holds for that product
is skipped, whether it is an upsert or a delete, so replays and late duplicates never roll the
index back. An upsert's version may also sit inside the record (``product.version``); when both are
given they must agree. Events without a version apply in log order (last one wins).

A partial update changes some fields of a stored product (price, stock, attributes: the
``PATCH /v1/products/{id}`` contract, vitrine/merchandising/patch.py), encoding nothing again unless its
embedded text or photo changed::

    {"op": "patch", "id": "15970", "fields": {"price": 1999, "in_stock": false}, "version": 9}

A record with a null value and a key (a Kafka *tombstone*, the log-compaction convention) is a
delete of that key.

A third shape carries a shopper event (click, view, add to cart, purchase on a logged search; the
``POST /v1/events`` contract, :class:`vitrine.feedback.intake.EventIn`), on the catalogue topic or
on a topic of its own (``vitrine consume --events``, default :data:`EVENTS_TOPIC`)::

    {"op": "event", "event": {"type": "click", "query_id": "...", "product_id": "15970", "position": 2}}

or the bare event object itself. Its key is free (``vitrine publish-events`` keys by
``query_id``); the worker stores it in the feedback log, de-duplicated by ``event_id`` (or a key
made from its content when it has none), so redelivery stores it once.

Every way a message can be bad raises :class:`BadEvent` with a ``kind`` (``json``, ``schema``,
``key``) and a one-line ``reason``: the worker sends the original bytes to the dead-letter topic
with them.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from vitrine.errors import InvalidInput
from vitrine.feedback.intake import EventIn
from vitrine.search.models import Product

EVENTS_TOPIC = "vitrine.events"
EVENTS_GROUP = "vitrine-events"


class BadEvent(InvalidInput):
    """A message that is not a valid catalogue event; ``kind`` says which check failed."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


class UpsertEvent(BaseModel):
    """Create or replace one product (the full record, photo included as ``image_b64`` or a URL)."""

    model_config = ConfigDict(extra="forbid")

    op: Literal["upsert"]
    product: Product
    version: int | None = Field(None, ge=0, description="The product's version, when the record carries none")

    @model_validator(mode="after")
    def _version(self) -> "UpsertEvent":
        pv = self.product.version
        if self.version is not None and pv is not None and pv != self.version:
            raise ValueError(f"version {self.version} disagrees with product.version {pv}")
        if pv is None and self.version is not None:
            self.product = self.product.model_copy(update={"version": self.version})
        self.version = self.product.version
        return self

    @property
    def id(self) -> str:
        return self.product.id


class DeleteEvent(BaseModel):
    """Remove one product from the index."""

    model_config = ConfigDict(extra="forbid")

    op: Literal["delete"]
    id: str = Field(min_length=1, max_length=256)
    version: int | None = Field(None, ge=0)


class PatchEvent(BaseModel):
    """Change some fields of one stored product (vitrine/merchandising/patch.py)."""

    model_config = ConfigDict(extra="forbid")

    op: Literal["patch"]
    id: str = Field(min_length=1, max_length=256)
    fields: dict[str, Any] = Field(min_length=1)
    version: int | None = Field(None, ge=0)

    def patch_fields(self) -> dict[str, Any]:
        return {**self.fields, "version": self.version} if self.version is not None else dict(self.fields)


class ShopperEvent(BaseModel):
    """A shopper event on a logged search, stored in the feedback log (not the catalogue)."""

    model_config = ConfigDict(extra="forbid")

    op: Literal["event"]
    event: EventIn

    @property
    def id(self) -> str:
        return self.event.query_id


Event = Annotated[UpsertEvent | DeleteEvent | PatchEvent | ShopperEvent, Field(discriminator="op")]
_EVENT = TypeAdapter(Event)


def _describe(e: ValidationError) -> str:
    parts = []
    for err in e.errors()[:5]:
        loc = ".".join(str(x) for x in err.get("loc", ()) if x not in ("upsert", "delete", "patch", "event")) or "event"
        if err.get("loc", ())[:1] == ("event",) and len(err.get("loc", ())) > 2:
            loc = "event." + loc  # a shopper event's field: event.position, event.type, ...
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return "; ".join(parts)


def parse_event(key: bytes | None, value: bytes | None) -> UpsertEvent | DeleteEvent | PatchEvent | ShopperEvent:
    """Bytes off the topic -> a validated event, or :class:`BadEvent` saying why not."""
    key_s: str | None = None
    if key is not None:
        try:
            key_s = key.decode("utf-8")
        except UnicodeDecodeError as e:
            raise BadEvent("key", f"message key is not UTF-8: {e}") from e
    if value is None:
        if not key_s:
            raise BadEvent("schema", "message has neither a value nor a key")
        return DeleteEvent(op="delete", id=key_s)
    try:
        obj: Any = json.loads(value)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadEvent("json", f"value is not JSON: {e}") from e
    if not isinstance(obj, dict):
        raise BadEvent("schema", f"value must be a JSON object, got {type(obj).__name__}")
    if "op" not in obj and "type" in obj:  # a bare shopper event (an events topic)
        obj = {"op": "event", "event": obj}
    if obj.get("op") not in ("upsert", "delete", "patch", "event"):
        raise BadEvent("schema", f"op must be 'upsert', 'delete', 'patch' or 'event', got {obj.get('op')!r}")
    try:
        ev = _EVENT.validate_python(obj)
    except ValidationError as e:
        raise BadEvent("schema", _describe(e)) from e
    except InvalidInput as e:  # raised as is by a field validator (e.g. image_b64 that is not base64)
        raise BadEvent("schema", f"product: {e}") from e
    if isinstance(ev, ShopperEvent):
        return ev  # any key (publish-events keys by query_id)
    if key_s is not None and key_s != ev.id:
        raise BadEvent("key", f"message key {key_s!r} is not the product id {ev.id!r} "
                              "(events must be keyed by product id to stay ordered)")
    return ev


def encode_event(ev: UpsertEvent | DeleteEvent | PatchEvent | ShopperEvent) -> tuple[bytes, bytes]:
    """An event -> (key, value) bytes as they go on the topic."""
    body: dict[str, Any]
    if isinstance(ev, ShopperEvent):
        body = {"op": "event", "event": ev.event.model_dump(exclude_none=True)}
    elif isinstance(ev, UpsertEvent):
        body = {"op": "upsert", "product": ev.product.model_dump(exclude_none=True)}
        if ev.version is not None:
            body["version"] = ev.version
    elif isinstance(ev, PatchEvent):
        body = ev.model_dump(exclude_none=True)
    else:
        body = {"op": "delete", "id": ev.id}
        if ev.version is not None:
            body["version"] = ev.version
    return ev.id.encode("utf-8"), json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def upsert(product: Product | dict[str, Any], version: int | None = None) -> UpsertEvent:
    p = product if isinstance(product, Product) else Product.model_validate(product)
    return UpsertEvent(op="upsert", product=p, version=version)


def delete(pid: str, version: int | None = None) -> DeleteEvent:
    return DeleteEvent(op="delete", id=pid, version=version)


def patch(pid: str, fields: dict[str, Any], version: int | None = None) -> PatchEvent:
    return PatchEvent(op="patch", id=pid, fields=fields, version=version)


def shopper_event(event: EventIn | dict[str, Any]) -> ShopperEvent:
    e = event if isinstance(event, EventIn) else EventIn.model_validate(event)
    return ShopperEvent(op="event", event=e)
