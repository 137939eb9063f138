"""Scoped API keys (like Typesense's scoped keys or Algolia's secured keys): a key limited to some
routes (``events``, ``search``, ``suggest``), that may expire and carry its own rate. Made with
`vitrine keys create` or ``POST /v1/keys`` (the write key), kept in ``keys.json`` in the data dir:
JSON, with each key's SHA-256 only (the key itself is shown once, when made). Re-read when the
file changes, so every worker sees a new or revoked key within a second.

The write key (``api_key``) and the events key (``events_key``) of the settings are not scoped keys:
they work as before (the write key everywhere, the events key on ``POST /v1/events``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vitrine.watched import WatchedFile
from vitrine.atomic import atomic_write_bytes
from vitrine.errors import InvalidInput, NotFound

FILE = "keys.json"
FORMAT = 1
SCOPES = ("events", "search", "suggest")


@dataclass
class ScopedKey:
    """One scoped key as stored (``sha256``: of the key; the key itself is never stored)."""

    id: str
    sha256: str
    routes: list[str]
    expires: float | None = None  # seconds since the epoch; None: never
    rate_per_minute: float | None = None  # None: the server's per-client rates only
    created: float = field(default_factory=time.time)
    description: str = ""

    def expired(self, now: float | None = None) -> bool:
        return self.expires is not None and (now or time.time()) >= self.expires

    def public(self) -> dict[str, Any]:
        """What listing a key shows (never its hash)."""
        d = asdict(self)
        d.pop("sha256")
        return d


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class ScopedKeys:
    """The data dir's scoped keys (see the module docstring)."""

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / FILE
        self._file: WatchedFile[dict[str, ScopedKey]] = WatchedFile(self.path, self._read, {})  # by sha256

    def _load(self) -> dict[str, ScopedKey]:
        return self._file.get()

    def _read(self) -> dict[str, ScopedKey]:
        try:
            d = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        if d.get("format") != FORMAT:
            return {}
        keys = [ScopedKey(**k) for k in d.get("keys", [])]
        return {k.sha256: k for k in keys}

    def _write(self, keys: dict[str, ScopedKey]) -> None:
        body = {"format": FORMAT, "keys": [asdict(k) for k in sorted(keys.values(), key=lambda k: k.id)]}
        atomic_write_bytes(self.path, json.dumps(body, indent=1, sort_keys=True).encode())
        self._file.invalidate()

    def find(self, key: str | None) -> ScopedKey | None:
        """The scoped key ``key`` is (None: not one)."""
        if not key:
            return None
        digest = _digest(key)
        for h, k in self._load().items():
            if hmac.compare_digest(h, digest):
                return k
        return None

    def create(self, routes: list[str], *, expires_in_s: float | None = None, rate_per_minute: float | None = None,
               description: str = "") -> tuple[str, ScopedKey]:
        """A new key: (the key, shown only now; what is stored)."""
        routes = sorted(set(routes))
        bad = [r for r in routes if r not in SCOPES]
        if not routes or bad:
            raise InvalidInput(f"routes: each one of {', '.join(SCOPES)} (got {', '.join(routes) or 'none'})")
        if expires_in_s is not None and expires_in_s <= 0:
            raise InvalidInput("expires_in_s: must be positive")
        if rate_per_minute is not None and rate_per_minute <= 0:
            raise InvalidInput("rate_per_minute: must be positive")
        key = "vsk_" + secrets.token_urlsafe(24)
        rec = ScopedKey(id=secrets.token_hex(6), sha256=_digest(key), routes=routes,
                        expires=time.time() + expires_in_s if expires_in_s is not None else None,
                        rate_per_minute=rate_per_minute, description=description)
        keys = dict(self._read())
        keys[rec.sha256] = rec
        self._write(keys)
        return key, rec

    def list(self) -> list[ScopedKey]:
        return sorted(self._read().values(), key=lambda k: k.created)

    def revoke(self, key_id: str) -> None:
        keys = self._read()
        left = {h: k for h, k in keys.items() if k.id != key_id}
        if len(left) == len(keys):
            raise NotFound("scoped key", key_id)
        self._write(left)
