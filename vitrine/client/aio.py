"""The asynchronous client (asyncio, httpx.AsyncClient): the same calls as :class:`vitrine.client.Client`, awaited."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from typing import Any

import httpx
from pydantic import BaseModel

from vitrine.client.base import (
    API_PREFIX,
    RETRY_STATUSES,
    RetryPolicy,
    Unreachable,
    events_body,
    headers,
    one_event,
    read,
    retryable,
    search_body,
)
from vitrine.feedback.intake import EventIn, EventsAccepted
from vitrine.search.models import (
    CompareResponse,
    FacetsResponse,
    Filters,
    Product,
    ProductOut,
    RecommendResponse,
    SearchResponse,
)


class AsyncClient:
    """Vitrine's API over HTTP (httpx, asyncio), typed by the API's models. ``timeout``: seconds per
    request (connect, read, write); ``retry``: how often and how long to back off."""

    def __init__(self, url: str = "http://127.0.0.1:8000", *, api_key: str | None = None, timeout: float = 30.0,
                 retry: RetryPolicy | None = None, http: httpx.AsyncClient | None = None) -> None:
        self.url = url.rstrip("/")
        self.retry = retry or RetryPolicy()
        self._http = http or httpx.AsyncClient(base_url=self.url, timeout=timeout, headers=headers(api_key))

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def request(self, method: str, path: str, model: type[BaseModel] | None = None, *,
                timeout: float | None = None, **kw: Any) -> Any:
        """One API call (``path`` under /v1), retried per the policy; the answer as ``model``."""
        path = API_PREFIX + path
        again = retryable(method, path)
        if timeout is not None:
            kw["timeout"] = timeout
        last: Exception | None = None
        for attempt in range(self.retry.attempts):
            try:
                r = await self._http.request(method, path, **kw)
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:  # never reached the server
                last = e
                wait = self.retry.wait(attempt)
            except (httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError, httpx.TimeoutException) as e:
                if not again:
                    raise Unreachable(f"{method} {self.url}{path}: {e}") from e
                last, wait = e, self.retry.wait(attempt)
            else:
                if r.status_code not in RETRY_STATUSES or attempt == self.retry.attempts - 1:
                    return read(r, model)
                last, wait = None, self.retry.wait(attempt, r)
            if attempt < self.retry.attempts - 1:
                await asyncio.sleep(wait)
        raise Unreachable(f"{method} {self.url}{path}: gave up after {self.retry.attempts} attempts: {last}") from last

    # -- search ---------------------------------------------------------------------------------
    async def search(self, text: str | None = None, *, image: bytes | None = None, k: int = 10, offset: int = 0,
               sort: str = "relevance", filters: Filters | Mapping[str, Any] | None = None,
               facets: Iterable[str] = (), highlight: bool = False, explain: bool = False,
               use_intent: bool = True, user: str | None = None, session: str | None = None) -> SearchResponse:
        """Search by words, a photo (bytes) or both: one page of ``k`` results from ``offset``. Its
        ``query_id`` is what events on it name (``user``: a pseudonymous shopper token)."""
        body = search_body(text, image=image, k=k, offset=offset, sort=sort, filters=filters, facets=facets,
                           highlight=highlight, explain=explain, use_intent=use_intent, user=user, session=session)
        return await self.request("POST", "/search", SearchResponse, json=body)

    # -- shopper events (POST /v1/events: the write key or the events key) ----------------------------
    async def events(self, events: Iterable[EventIn | Mapping[str, Any]]) -> EventsAccepted:
        """Send a batch of shopper events (up to 1,000; all or nothing: a bad one raises ApiError 422
        naming its field). Retried safely: each event carries an ``event_id``."""
        return await self.request("POST", "/events", EventsAccepted, json=events_body(events))

    async def click(self, query_id: str, product_id: str, position: int, **kw: Any) -> EventsAccepted:
        """A click on ``product_id`` shown at ``position`` (0-based, counting offset) by search ``query_id``;
        ``kw``: user, session, timestamp, event_id."""
        return await self.events([one_event("click", query_id, product_id, position, **kw)])

    async def view(self, query_id: str, product_id: str, position: int, **kw: Any) -> EventsAccepted:
        return await self.events([one_event("view", query_id, product_id, position, **kw)])

    async def add_to_cart(self, query_id: str, product_id: str, position: int, **kw: Any) -> EventsAccepted:
        return await self.events([one_event("add_to_cart", query_id, product_id, position, **kw)])

    async def purchase(self, query_id: str, product_id: str, position: int, **kw: Any) -> EventsAccepted:
        return await self.events([one_event("purchase", query_id, product_id, position, **kw)])

    async def facets(self, fields: Iterable[str] | None = None, limit: int = 50) -> FacetsResponse:
        return await self.request("GET", "/facets", FacetsResponse, params={"field": list(fields or []), "limit": limit})

    # -- products ---------------------------------------------------------------------------------
    async def product(self, pid: str) -> ProductOut:
        return await self.request("GET", f"/products/{pid}", ProductOut)

    async def put_product(self, product: Product | Mapping[str, Any]) -> dict[str, Any]:
        p = product if isinstance(product, Product) else Product.model_validate(product)
        return await self.request("PUT", f"/products/{p.id}", json=p.model_dump(exclude_none=True))

    async def delete_product(self, pid: str) -> dict[str, Any]:
        return await self.request("DELETE", f"/products/{pid}")

    async def recommend(self, pid: str, kind: str = "similar", k: int = 10) -> RecommendResponse:
        return await self.request("GET", f"/recommend/{pid}", RecommendResponse, params={"kind": kind, "k": k})

    async def compare(self, ids: list[str] | None = None, text: str | None = None) -> CompareResponse:
        body = {"ids": ids} if ids is not None else {"text": text}
        return await self.request("POST", "/compare", CompareResponse, json=body)

    # -- operations -------------------------------------------------------------------------------
    async def health(self) -> dict[str, Any]:
        return await self.request("GET", "/health")

    async def metrics(self) -> str:
        return await self.request("GET", "/metrics")

    async def wait_ready(self, timeout: float = 60.0, every: float = 0.2) -> dict[str, Any]:
        """Poll /health until the server answers (Unreachable past ``timeout``)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                r = await self._http.get(API_PREFIX + "/health", timeout=max(0.5, min(5.0, timeout)))
                if r.status_code == 200:
                    return r.json()
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise Unreachable(f"{self.url} not ready after {timeout:g}s")
            await asyncio.sleep(every)

    async def swap(self, request: Any, timeout: float | None = None) -> Any:  # SwapRequest -> SwapReport
        """Hot swap (needs the API key); a refused candidate raises ApiError 409 with the report as detail."""
        from vitrine.search.swap import SwapReport, SwapRequest  # loads the model code

        req = request if isinstance(request, SwapRequest) else SwapRequest.model_validate(request)
        return await self.request("POST", "/admin/swap", SwapReport, json=req.model_dump(exclude_none=True),
                            timeout=timeout)

    async def snapshot(self) -> dict[str, Any]:
        return await self.request("POST", "/admin/snapshot")

    async def snapshots(self) -> dict[str, Any]:
        return await self.request("GET", "/admin/snapshots")
