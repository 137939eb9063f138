"""What the sync and async clients share: building requests, the retry policy, reading answers."""

from __future__ import annotations

import base64
import random
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import BaseModel

from vitrine.errors import VitrineError
from vitrine.feedback.intake import EventIn
from vitrine.search.models import Filters, SearchRequest

API_PREFIX = "/v1"
RETRY_STATUSES = frozenset({503})


class ApiError(VitrineError):
    """The API refused or failed a request: its status, error code, message and detail."""

    def __init__(self, status: int, code: str, message: str, detail: Any = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message, self.detail = status, code, message, detail

    @classmethod
    def of(cls, r: httpx.Response) -> "ApiError":
        try:
            err = r.json().get("error") or {}
        except ValueError:
            err = {}
        return cls(r.status_code, str(err.get("code") or "http_error"), str(err.get("message") or r.text[:300]),
                   err.get("detail"))


class Unreachable(VitrineError):
    """The server could not be reached (or kept answering 503) after every retry."""


@dataclass(frozen=True)
class RetryPolicy:
    """``attempts`` tries in all; waits ``base_s * 2**n`` (full jitter) between them, at most ``max_s``."""

    attempts: int = 4
    base_s: float = 0.1
    max_s: float = 5.0

    def wait(self, attempt: int, response: httpx.Response | None = None) -> float:
        if response is not None:
            after = response.headers.get("retry-after")
            if after is not None:
                try:
                    return min(self.max_s, max(0.0, float(after)))
                except ValueError:
                    pass
        return random.uniform(0, min(self.max_s, self.base_s * (2 ** attempt)))


def search_body(text: str | None = None, *, image: bytes | None = None, k: int = 10, offset: int = 0,
                sort: str = "relevance", filters: Filters | Mapping[str, Any] | None = None,
                facets: Iterable[str] = (), highlight: bool = False, explain: bool = False,
                use_intent: bool = True, user: str | None = None, session: str | None = None) -> dict[str, Any]:
    """A search request's JSON body, validated by the API's own model before it is sent."""
    req = SearchRequest(text=text, image_b64=base64.b64encode(image).decode() if image is not None else None, k=k,
                        offset=offset, sort=sort, facets=list(facets),
                        filters=Filters.model_validate(filters) if isinstance(filters, Mapping) else filters,
                        highlight=highlight, explain=explain, use_intent=use_intent, user=user, session=session)
    return req.model_dump(exclude_defaults=True, by_alias=True)


def events_body(events: Iterable[EventIn | Mapping[str, Any]]) -> dict[str, Any]:
    """A ``POST /v1/events`` body, each event validated by the API's own model. An event without
    an ``event_id`` gets a random one here, so a retried call is stored once and two real clicks
    with the same content stay two."""
    out = []
    for e in events:
        ev = e if isinstance(e, EventIn) else EventIn.model_validate(e)
        if ev.event_id is None:
            ev = ev.model_copy(update={"event_id": uuid.uuid4().hex})
        out.append(ev.model_dump(exclude_none=True))
    return {"events": out}


def one_event(etype: str, query_id: str, product_id: str, position: int, *, user: str | None = None,
              session: str | None = None, timestamp: float | None = None,
              event_id: str | None = None) -> dict[str, Any]:
    return {"type": etype, "query_id": query_id, "product_id": product_id, "position": position, "user": user,
            "session": session, "timestamp": timestamp, "event_id": event_id}


def read(r: httpx.Response, model: type[BaseModel] | None) -> Any:
    """The answer as ``model`` (or JSON when None); an error answer raises :class:`ApiError`."""
    if r.status_code >= 400:
        raise ApiError.of(r)
    if model is None:
        return r.json() if r.headers.get("content-type", "").startswith("application/json") else r.text
    return model.model_validate_json(r.content)


def retryable(method: str, path: str) -> bool:
    """Whether a request may be sent again after it may have reached the server (not a hot swap
    or a snapshot: those change state once)."""
    return not (method == "POST" and path.startswith(f"{API_PREFIX}/admin/"))


def headers(api_key: str | None) -> dict[str, str]:
    return {"X-API-Key": api_key} if api_key else {}
