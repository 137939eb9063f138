"""Scoped API keys (vitrine/web/keys.py): made, listed and revoked with the write key."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from vitrine.web.deps import KeyRequired
from vitrine.web.errors import errors_for

router = APIRouter(prefix="/keys", tags=["keys"])


class KeyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"routes": ["events"], "expires_in_s": 86400, "rate_per_minute": 120, "description": "storefront"}]})

    routes: list[Literal["events", "search", "suggest"]] = Field(min_length=1, description="Routes the key may call")
    expires_in_s: float | None = Field(None, gt=0, description="Seconds until it expires (absent: never)")
    rate_per_minute: float | None = Field(None, gt=0, description="Its own rate over all its clients (absent: "
                                                                  "only the per-client rates)")
    description: str = Field("", max_length=200)


class KeyOut(BaseModel):
    id: str
    routes: list[str]
    expires: float | None = None
    rate_per_minute: float | None = None
    created: float
    description: str = ""
    key: str | None = Field(None, description="The key itself: shown once, when made")


@router.post("", response_model=KeyOut, status_code=201, dependencies=[KeyRequired], responses=errors_for(401))
def create_key(body: KeyRequest, request: Request) -> KeyOut:
    """Make a scoped key (needs the write key): limited to `routes`, expiring after
    `expires_in_s`, with its own `rate_per_minute`. The key is in this answer only."""
    key, rec = request.app.state.keys.create(list(body.routes), expires_in_s=body.expires_in_s,
                                             rate_per_minute=body.rate_per_minute, description=body.description)
    return KeyOut(**rec.public(), key=key)


@router.get("", response_model=list[KeyOut], response_model_exclude_none=True, dependencies=[KeyRequired],
            responses=errors_for(401))
def list_keys(request: Request) -> list[KeyOut]:
    """The scoped keys (never the keys themselves; needs the write key)."""
    return [KeyOut(**k.public()) for k in request.app.state.keys.list()]


@router.delete("/{key_id}", dependencies=[KeyRequired], responses=errors_for(401, 404, ok={"id": "3f2a9c1d0b7e",
                                                                                        "revoked": True}))
def revoke_key(key_id: str, request: Request) -> dict[str, Any]:
    """Revoke a scoped key by id (needs the write key)."""
    request.app.state.keys.revoke(key_id)
    return {"id": key_id, "revoked": True}
