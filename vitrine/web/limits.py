"""Who is asking, and how often they may: the client fingerprint and the API's rate limits.

- :func:`fingerprint`: a hash of the client's address and user agent. The routes pass it with the
  search or the events they hand to the engine (the request's own value, never a global); the
  feedback log keys it again before storing it (vitrine/feedback/intake.py), and learning counts
  evidence per client (vitrine/feedback/clicks.py).
- :class:`RateLimit`: per client and per key, on ``/v1/search`` (and ``/search/image``),
  ``/v1/events`` and ``/v1/suggest``: past the rate, 429 with ``Retry-After``. The rates are
  settings (``rate_search_per_minute`` ...; 0: no limit); a scoped key (vitrine/web/keys.py)
  carries its own, and is refused (401 expired, 403 outside its routes) here too.

The limiter is a token bucket of our own, a few lines: ``pyrate-limiter`` is in the environment
only as another package's dependency, and its v4 API tells no wait time for ``Retry-After``
without reaching into its buckets. Per process: with several workers each holds its own buckets
(a client's limit is per worker).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import threading
import time

from starlette.types import ASGIApp, Receive, Scope, Send

from vitrine.settings import Settings
from vitrine.web.keys import ScopedKeys
from vitrine.web.guards import send_error

MAX_BUCKETS = 100_000


def fingerprint(host: str | None, user_agent: str | None) -> str:
    """The client of a request: its address and user agent, hashed."""
    return hashlib.sha256(f"{host or ''}\n{user_agent or ''}".encode()).hexdigest()[:32]


def trusted(settings: Settings, key: str | None) -> bool:
    """Whether a request carries the write key (``VITRINE_API_KEY``): a shop's own server, which
    speaks for many shoppers from one address (a storefront backend, a replay of logs, a simulator).
    Its calls are not rate limited per client and its shoppers are told apart by their ``user`` or
    ``session``, not by the server's address; the public events key handed to browsers never is."""
    write = settings.web.api_key
    return bool(key) and write is not None and hmac.compare_digest(str(key).encode(), write.get_secret_value().encode())


def client_of(settings: Settings, host: str | None, user_agent: str | None, key: str | None) -> str | None:
    """The fingerprint the engine counts evidence by: None for a trusted server (see :func:`trusted`)."""
    return None if trusted(settings, key) else fingerprint(host, user_agent)


class TokenBuckets:
    """One token bucket per name: ``rate`` tokens a minute, as many at most (a minute's burst)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}  # name -> (tokens, when)

    def take(self, name: str, per_minute: float, now: float | None = None) -> float:
        """Take a token: 0 when there was one, else the seconds until there is."""
        now = time.monotonic() if now is None else now
        per_s = per_minute / 60.0
        with self._lock:
            tokens, when = self._buckets.get(name, (per_minute, now))
            tokens = min(per_minute, tokens + (now - when) * per_s)
            if tokens >= 1.0:
                self._buckets[name] = (tokens - 1.0, now)
                return 0.0
            self._buckets[name] = (tokens, now)
            if len(self._buckets) > MAX_BUCKETS:  # forget the idle ones (full again by now)
                self._buckets = {k: v for k, v in self._buckets.items() if now - v[1] < 60.0}
            return (1.0 - tokens) / per_s


def route_of(path: str, method: str) -> str | None:
    """Which limited route group a request is (None: not limited)."""
    p = path[3:] if path.startswith("/v1/") else path
    if p in ("/search", "/search/image") and method == "POST":
        return "search"
    if p == "/events" and method == "POST":
        return "events"
    if p == "/suggest" and method == "GET":
        return "suggest"
    return None


class RateLimit:
    """Rate limits and scoped-key checks on the limited routes (see the module docstring)."""

    def __init__(self, app: ASGIApp, settings: Settings, keys: ScopedKeys) -> None:
        self.app, self.settings, self.keys = app, settings, keys
        self.buckets = TokenBuckets()

    def _rate(self, group: str) -> float:
        w = self.settings.web
        return {"search": w.rate_search_per_minute, "events": w.rate_events_per_minute,
                "suggest": w.rate_suggest_per_minute}[group]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        group = route_of(scope.get("path", ""), scope.get("method", ""))
        if group is None:
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        key = headers.get(b"x-api-key", b"").decode("latin-1") or None
        scoped = self.keys.find(key)
        if scoped is not None:
            if scoped.expired():
                return await send_error(send, 401, "unauthorized", f"scoped key {scoped.id} has expired")
            if group not in scoped.routes:
                return await send_error(send, 403, "forbidden", f"scoped key {scoped.id} may only call "
                                        f"{', '.join(scoped.routes)}, not {group}")
        host = (scope.get("client") or (None, None))[0]
        client = fingerprint(host, headers.get(b"user-agent", b"").decode("latin-1"))
        waits = []
        rate = self._rate(group)
        if rate > 0 and not trusted(self.settings, key):
            waits.append(self.buckets.take(f"c:{group}:{client}", rate))
        if scoped is not None and scoped.rate_per_minute:
            waits.append(self.buckets.take(f"k:{scoped.id}", scoped.rate_per_minute))
        elif key and self.settings.web.rate_key_per_minute > 0:
            waits.append(self.buckets.take(f"k:{group}:{fingerprint(key, None)}", self.settings.web.rate_key_per_minute))
        wait = max(waits, default=0.0)
        if wait > 0:
            retry = max(1, math.ceil(wait))
            return await send_error(send, 429, "rate_limited", f"too many {group} requests from this client or "
                                    f"key: retry after {retry} s", headers=[(b"retry-after", str(retry).encode())])
        return await self.app(scope, receive, send)
