"""What the feedback log (vitrine/feedback/eventlog.py, on SQLite or PostgreSQL) and its users
share: a logged search, an event, a slice of the
log for learning, the log's interface, query ids, and the HMAC that stands for a user token.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


EVENT_TYPES = ("view", "click", "add_to_cart", "purchase")


def new_query_id(now: float | None = None) -> str:
    """An opaque, unique search id; its first 11 hex digits are the millisecond it was made,
    so an unknown id can be told apart from one that retention removed."""
    return f"{int((now or time.time()) * 1000):011x}{secrets.token_hex(8)}"


def query_id_time(query_id: str) -> float | None:
    """When a :func:`new_query_id` id was made (None: not one of ours)."""
    try:
        return int(query_id[:11], 16) / 1000 if len(query_id) == 27 else None
    except ValueError:
        return None


@dataclass(frozen=True)
class SearchLog:
    """One logged search: what the shopper saw (``ids`` from rank ``offset``)."""

    query_id: str
    ts: float
    text: str | None
    norm: str
    ids: tuple[str, ...]
    offset: int = 0
    total: int | None = None
    image: bool = False
    user: str | None = None  # hashed
    session: str | None = None
    experiment: str | None = None
    variant: str | None = None
    client: str | None = None  # hashed fingerprint of the client (address and user agent)
    sort: str | None = None  # the page's order (None or "relevance": by relevance)
    filters: str | None = None  # the page's filters as JSON (None: no filter)

    def rank_of(self, product_id: str) -> int | None:
        """The product's 0-based rank on this search's page (counting offset), None if not shown."""
        try:
            return self.offset + self.ids.index(product_id)
        except ValueError:
            return None


@dataclass(frozen=True)
class EventRecord:
    """One stored shopper event (``position``: the product's rank on the logged page)."""

    event_id: str
    query_id: str
    type: str
    product_id: str
    position: int
    ts: float
    user: str | None = None  # hashed
    session: str | None = None
    client: str | None = None  # hashed fingerprint of the client that posted it


@dataclass
class FeedbackSlice:
    """Searches and events between two times, as learning and analytics read them."""

    searches: list[SearchLog] = field(default_factory=list)
    events: list[EventRecord] = field(default_factory=list)


def event_key(query_id: str, etype: str, product_id: str, user: str | None, ts: float | None) -> str:
    """The id of an event sent without one: the same content is the same event."""
    raw = json.dumps([query_id, etype, product_id, user, ts], ensure_ascii=False)
    return "auto:" + hashlib.sha256(raw.encode()).hexdigest()[:32]


@runtime_checkable
class EventLogAPI(Protocol):
    """What the engine needs from a feedback log (vitrine/feedback/eventlog.py: SQLite or PostgreSQL)."""

    target: str  # the SQLite file or PostgreSQL URL it opened (another process opens the same log)

    def hash_user(self, user: str | None) -> str | None: ...

    def log_search(self, s: SearchLog) -> None: ...

    def log_searches(self, batch: Sequence[SearchLog]) -> None: ...

    def check_writable(self) -> None: ...

    def searches(self, query_ids: Sequence[str]) -> dict[str, SearchLog]: ...

    def add_events(self, events: Sequence[EventRecord]) -> int: ...

    def read(self, since: float = 0.0, until: float | None = None) -> FeedbackSlice: ...

    def purge(self, before: float) -> int: ...

    def counts(self) -> dict[str, int]: ...

    def popular_queries(self, since: float, min_users: int, limit: int,
                        bot_per_minute: int = 0) -> list[tuple[str, float]]: ...

    def aggregate(self, since: float, until: float, bucket_s: float, top: int) -> dict[str, list[tuple]]: ...

    def bots(self, since: float, until: float, per_minute: int) -> tuple[int, int]: ...

    def experiment_searches(self, experiment: str, since: float, until: float
                            ) -> tuple[list[tuple[str, list[str], str | None]], list[tuple[str, str]]]: ...

    def get_meta(self, key: str) -> str | None: ...

    def set_meta(self, key: str, value: str) -> None: ...

    def close(self) -> None: ...


class UserHasher:
    """HMAC-SHA256 of user tokens under one key per log (made once, kept in its meta table)."""

    def __init__(self, key: bytes) -> None:
        self.key = key

    def __call__(self, user: str | None) -> str | None:
        if not user:
            return None
        return hmac.new(self.key, user.encode(), hashlib.sha256).hexdigest()[:24]
