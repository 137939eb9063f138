"""ASGI guards in front of the API: content types and time limits, answered in the one JSON error shape.

- :class:`ContentTypeGuard`: a request body must come in the type its route takes
  (``application/json``, or ``multipart/form-data`` for photo uploads), else 415 naming both.
- :class:`RequestTimeout`: a request that runs past its limit gets 504; the work it started is
  abandoned (its answer dropped when it ends), so a stuck request never holds a client.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)


def _error(status: int, code: str, message: str) -> bytes:
    return json.dumps({"error": {"status": status, "code": code, "message": message}}).encode()


async def send_error(send: Send, status: int, code: str, message: str,
                     headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), *(headers or [])]})
    await send({"type": "http.response.body", "body": _error(status, code, message)})


class ContentTypeGuard:
    """415 for a body whose content type the route does not take."""

    def __init__(self, app: ASGIApp, *, json_prefixes: tuple[str, ...], multipart_paths: tuple[str, ...]) -> None:
        self.app = app
        self.json_prefixes = json_prefixes
        self.multipart_paths = multipart_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        path: str = scope.get("path", "")
        multipart = path in self.multipart_paths
        if not multipart and not path.startswith(self.json_prefixes):
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        ctype = headers.get(b"content-type", b"").decode("latin-1").split(";")[0].strip().lower()
        length = headers.get(b"content-length")
        has_body = b"transfer-encoding" in headers or (length is not None and length.strip() not in (b"0", b""))
        if not has_body and not ctype:
            return await self.app(scope, receive, send)  # no body: the route's validation answers
        if multipart:
            ok, want = ctype == "multipart/form-data", "multipart/form-data"
        else:
            ok, want = ctype == "application/json" or (ctype.startswith("application/") and ctype.endswith("+json")), \
                "application/json"
        if ok:
            return await self.app(scope, receive, send)
        await send_error(send, 415, "unsupported_media_type",
                         f"{path} takes {want}, not {ctype or 'a body without a content type'}")


class RequestTimeout:
    """504 when a request runs past its limit (``limit_for(path)`` seconds)."""

    def __init__(self, app: ASGIApp, *, limit_for: Callable[[str], float]) -> None:
        self.app = app
        self.limit_for = limit_for
        self._abandoned: set[asyncio.Task[Any]] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.limit_for(scope.get("path", ""))
        state = {"started": False, "timed_out": False}

        async def guarded_send(msg: Message) -> None:
            if state["timed_out"]:
                return
            if msg["type"] == "http.response.start":
                state["started"] = True
            await send(msg)

        task = asyncio.ensure_future(self.app(scope, receive, guarded_send))
        done, _ = await asyncio.wait({task}, timeout=limit)
        if task in done or state["started"]:  # finished, or already answering: let it finish
            return await task
        state["timed_out"] = True
        self._abandoned.add(task)
        task.add_done_callback(self._forget)
        log.warning("%s %s ran past %gs: answered 504, its work abandoned", scope.get("method"), scope.get("path"),
                    limit)
        await send_error(send, 504, "timeout", f"the request took longer than {limit:g} s")

    def _forget(self, task: asyncio.Task[Any]) -> None:
        self._abandoned.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("abandoned request ended with %r", task.exception())
