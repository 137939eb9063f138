"""Shopper events in: clicks, add-to-carts, purchases and views on a search's results."""

from __future__ import annotations

import hmac
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Request
from fastapi.responses import JSONResponse

from vitrine.errors import Unauthorized
from vitrine.feedback.intake import EventsAccepted, EventsRequest
from vitrine.web.deps import FeedbackJobsDep, SettingsDep
from vitrine.web.errors import errors_for
from vitrine.web.limits import client_of

router = APIRouter(tags=["feedback"])


async def require_events_key(settings: SettingsDep, request: Request,
                             x_api_key: Annotated[str | None, Header()] = None) -> None:
    """The write key, the events-only key (``VITRINE_EVENTS_KEY``) a browser may hold, or a scoped
    key for events (vitrine/web/keys.py; its expiry and routes are checked in front, by RateLimit)."""
    scoped = request.app.state.keys.find(x_api_key)
    if scoped is not None and "events" in scoped.routes and not scoped.expired():
        return
    keys = [k.get_secret_value() for k in (settings.web.api_key, settings.web.events_key) if k]
    if not keys:
        raise Unauthorized("events are disabled: the server has no API key or events key configured "
                           "(VITRINE_API_KEY, VITRINE_EVENTS_KEY)")
    if not x_api_key or not any(hmac.compare_digest(x_api_key.encode(), k.encode()) for k in keys):
        raise Unauthorized("a valid X-API-Key header (the write key or the events key) is required to post events")


def inline_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A pydantic JSON schema with its ``$defs`` written in place (an OpenAPI request body cannot
    point into a schema's own ``$defs``)."""
    defs = schema.pop("$defs", {})

    def walk(x: Any) -> Any:
        if isinstance(x, dict):
            ref = x.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return walk(defs[ref.rsplit("/", 1)[1]])
            return {k: walk(v) for k, v in x.items()}
        return [walk(v) for v in x] if isinstance(x, list) else x

    return walk(schema)


# The body is declared here and parsed where it is stored (vitrine/web/sideproc.py: in the intake's
# process), not by FastAPI on the event loop: a batch of a thousand events took 5-10 ms to parse and
# pickle there, time every search in flight waited for.
BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": inline_schema(EventsRequest.model_json_schema())}}}}


@router.post("/events", status_code=202, response_model=EventsAccepted, dependencies=[Depends(require_events_key)],
             responses=errors_for(401, 403, 429), openapi_extra=BODY)
async def post_events(jobs: FeedbackJobsDep, request: Request) -> JSONResponse:
    """A batch of shopper events (up to 1,000) on logged searches, each naming its search's
    `query_id`. All or nothing: a bad event is a 422 naming its field, and nothing of the batch is
    stored. An event sent twice (same `event_id`) is stored once."""
    client = client_of(request.app.state.settings, request.client.host if request.client else None,
                       request.headers.get("user-agent"), request.headers.get("x-api-key"))
    accepted, new = await jobs.record_events(await request.body(), client)
    return JSONResponse(EventsAccepted(accepted=accepted, new=new).model_dump(), status_code=202)
