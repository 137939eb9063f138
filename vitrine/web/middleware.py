"""Plain-ASGI middleware of the API: request metrics (and the JSON shape of an unhandled error),
and the request-body limit. Plain ASGI rather than ``@app.middleware("http")``: Starlette's
BaseHTTPMiddleware streams every response through an extra task and queue, a measurable share
of a search's CPU on a busy server."""

from __future__ import annotations

import json
import logging
import time

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vitrine.web.errors import error_body
from vitrine.web.metrics import Metrics

log = logging.getLogger(__name__)


class ObserveRequests:
    """Request count and latency per route (Prometheus), and the one JSON error shape for an
    unhandled error."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        status: int | None = None

        async def observed_send(msg: Message) -> None:
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]
            await send(msg)

        try:
            await self.app(scope, receive, observed_send)
        except Exception:
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            if status is not None:  # the answer had started: nothing to do but cut it short
                raise
            status = 500
            response = JSONResponse(error_body(500, "internal", "internal server error"), status_code=500)
            await response(scope, receive, send)
        route = scope.get("route")
        self.metrics.observe_request(scope.get("method", ""), getattr(route, "path", "unmatched"), status or 500,
                                     time.perf_counter() - t0)


class BodyLimit:
    """Refuses request bodies over ``limit`` bytes with 413, declared or streamed."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for k, v in scope.get("headers", []):
            if k == b"content-length":
                try:
                    declared = int(v)
                except ValueError:
                    declared = -1
                if declared > self.limit or declared < 0:
                    return await self._reject(send)
        seen = 0
        started = False

        async def limited() -> Message:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.limit:
                    raise _BodyTooLarge
            return msg

        async def tracking_send(msg: Message) -> None:
            nonlocal started
            if msg["type"] == "http.response.start":
                started = True
            await send(msg)

        try:
            await self.app(scope, limited, tracking_send)
        except _BodyTooLarge:
            if not started:
                await self._reject(send)

    async def _reject(self, send: Send) -> None:
        body = json.dumps(error_body(413, "too_large", f"request body over the limit of {self.limit:,} bytes"))
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body.encode()})


class _BodyTooLarge(Exception):
    pass
