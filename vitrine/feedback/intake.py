"""Shopper feedback at serving time: log each API search, take events on it, re-rank head queries
by what shoppers chose.

- :meth:`Feedback.log_search` gives a search its ``query_id`` and logs what it showed (the page's
  ids from its offset) in the event log (vitrine/feedback/eventlog.py: SQLite in the data dir, or
  PostgreSQL), so an event needs only the ``query_id``, the product and its position.
- :meth:`Feedback.record` validates a batch of events against the logged searches and stores it
  in one transaction: all of it, or none of it and an error naming the field of the first bad
  event (unknown type, unknown or expired ``query_id``, a product not on that page, a negative
  position, a batch over the limit). Re-sent events (same ``event_id``) are stored once.
- :class:`LearnedQueries` serves what `vitrine tune` learned from the log
  (vitrine/feedback/learning.py fits it): per head query, a boost per product from position-bias
  corrected click, add-to-cart and purchase evidence. The file (``learned.json`` in the data
  dir) is this module's format; it is re-read when it changes, so every worker picks it up.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from vitrine.watched import WatchedFile
from vitrine.atomic import atomic_write_bytes
from vitrine.errors import InvalidBody, InvalidInput
from vitrine.feedback import explored, ltr
from vitrine.feedback.blocklist import Blocklist, blocked
from vitrine.feedback.logwriter import BatchedSearchLog
from vitrine.feedback.types import EventLogAPI, EventRecord, SearchLog, event_key, new_query_id, query_id_time
from vitrine.index.querytext import normalise_query
from vitrine.search.models import Ranked, SearchRequest, SearchResponse
from vitrine.settings import FeedbackSettings

log = logging.getLogger(__name__)

LEARNED_FILE = "learned.json"
LEARNED_FORMAT = 1
EventType = Literal["view", "click", "add_to_cart", "purchase"]
Resolver = Callable[[list[str]], dict[str, int]]  # product ids -> index ids (over the record store)


class EventIn(BaseModel):
    """One shopper event on a search's results."""

    model_config = ConfigDict(extra="forbid")

    type: EventType = Field(description="view, click, add_to_cart or purchase")
    query_id: str = Field(min_length=1, max_length=64, description="The search's query_id")
    product_id: str = Field(min_length=1, max_length=256)
    position: int = Field(ge=0, description="0-based rank on the page the shopper saw, counting offset")
    user: str | None = Field(None, max_length=256, description="Pseudonymous shopper token (stored hashed)")
    session: str | None = Field(None, max_length=256)
    timestamp: float | None = Field(None, description="Unix seconds when it happened (default: when received)")
    event_id: str | None = Field(None, min_length=1, max_length=128, description="Idempotency key: an event "
                                 "sent twice is stored once")

    @field_validator("timestamp")
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError("timestamp must be a finite number")
        return v


class EventsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"events": [
        {"type": "click", "query_id": "18c2f0a1b2c3d4e5f60718293", "product_id": "15970", "position": 0,
         "user": "u-81f2", "session": "s-1"}]}]})

    events: list[EventIn] = Field(min_length=1, description="Up to events_max_batch (1,000) events")


def parse_events(raw: bytes) -> list[EventIn]:
    """A POST /v1/events body (JSON bytes) -> its events; InvalidBody naming each field that does not
    fit :class:`EventsRequest` (``loc`` from ``"body"``, as the API's own validation names them)."""
    try:
        return EventsRequest.model_validate_json(raw).events
    except ValidationError as e:
        raise InvalidBody([{"loc": ["body", *err["loc"]], "msg": err["msg"]} for err in e.errors()]) from e


class EventsAccepted(BaseModel):
    accepted: int = Field(description="Events taken (stored now, or already stored: same event_id)")
    new: int = Field(description="Of those, events not seen before")


def filters_json(req: SearchRequest) -> str | None:
    """A search's filters as stored with it (None: no filter)."""
    if req.filters is None:
        return None
    got = req.filters.model_dump(exclude_none=True, exclude_defaults=True)
    return json.dumps(got, ensure_ascii=False, sort_keys=True, default=str) if got else None


FRESH_S = 10.0
"""A search made this recently that the log lacks may still be in another process's writer."""
WAIT_S = 0.5
"""The longest a batch waits for such searches (then they are unknown: a 422)."""


class Feedback:
    """Search logging and event intake over one event log (see the module docstring)."""

    def __init__(self, events: EventLogAPI, settings: FeedbackSettings, *, batched: bool = True) -> None:
        # searches are logged by a background writer, in batches (vitrine/feedback/logwriter.py): a
        # search never waits on the log; any read of the log waits for what was queued before it
        self._writer = BatchedSearchLog(events) if batched else None
        self.log: EventLogAPI = cast(EventLogAPI, self._writer) if self._writer is not None else events
        self.settings = settings

    def flush(self) -> None:
        """Wait until the searches logged so far are written (another process reading the log,
        vitrine/web/sideproc.py, then sees them)."""
        if self._writer is not None:
            self._writer.flush()

    @property
    def retention_s(self) -> float:
        return self.settings.events_retention_days * 86400.0

    def client_hash(self, client: str | None) -> str | None:
        """The stored form of a client fingerprint (keyed like user tokens: not reversible)."""
        return self.log.hash_user(f"client:{client}") if client else None

    def log_search(self, req: SearchRequest, resp: SearchResponse, *, experiment: str | None = None,
                   client: str | None = None) -> None:
        """Give ``resp`` a ``query_id`` and log what it showed and in what context (when logging
        is on); ``client``: the fingerprint of who asked."""
        if not self.settings.log_searches:
            return
        now = time.time()
        qid = new_query_id(now)
        text = (resp.query.get("text") if isinstance(resp.query, dict) else None) or req.text
        variant = resp.variant
        ex = resp.exploration
        if ex and experiment is None:  # an explored page (vitrine/feedback/explore.py): its draw and propensity
            experiment, variant = explored.EXPERIMENT, explored.variant_of(ex["from_rank"], ex["position"], ex["propensity"])
        self.log.log_search(SearchLog(
            query_id=qid, ts=now, text=text, norm=normalise_query(text), ids=tuple(h.id for h in resp.results),
            offset=req.offset, total=resp.total, image=bool(resp.query.get("image")) if resp.query else False,
            user=self.log.hash_user(req.user), session=req.session, experiment=experiment, variant=variant,
            client=self.client_hash(client), sort=req.sort if req.sort != "relevance" else None,
            filters=filters_json(req)))
        resp.query_id = qid

    def record(self, events: Sequence[EventIn], client: str | None = None) -> tuple[int, int]:
        """Validate and store a batch (all or nothing) posted by ``client`` (a fingerprint);
        returns (accepted, new)."""
        limit = self.settings.events_max_batch
        if len(events) > limit:
            raise InvalidInput(f"events: {len(events):,} events in one call; at most {limit:,}")
        if not events:
            raise InvalidInput("events: the batch is empty")
        now = time.time()
        logged = self.logged_searches([e.query_id for e in events], now)
        fp = self.client_hash(client)
        rows = [self._row(f"events[{i}]", e, logged, now, fp) for i, e in enumerate(events)]
        new = self.log.add_events(rows)
        return len(rows), new

    def record_valid(self, events: Sequence[EventIn]) -> tuple[int, int, list[tuple[int, str]]]:
        """Store the valid events of a batch (any size, in one transaction per
        ``events_max_batch``) and name what is wrong with the others: (accepted, new, [(index,
        reason)]). The Kafka worker's intake: a bad event is a dead letter, not a stalled batch."""
        now = time.time()
        rows: list[EventRecord] = []
        bad: list[tuple[int, str]] = []
        new = 0
        step = self.settings.events_max_batch
        for start in range(0, len(events), step):
            part = events[start:start + step]
            logged = self.logged_searches([e.query_id for e in part], now)
            rows = []
            for i, e in enumerate(part, start):
                try:
                    rows.append(self._row("event", e, logged, now))
                except InvalidInput as err:
                    bad.append((i, str(err)))
            new += self.log.add_events(rows)
        return len(events) - len(bad), new, bad

    def logged_searches(self, query_ids: Sequence[str], now: float) -> dict[str, SearchLog]:
        """The logged searches of ``query_ids``. One made in the last :data:`FRESH_S` s that the log
        does not hold yet is waited for (at most :data:`WAIT_S` s in all): another process answered it
        (a sibling worker, or the API process when events go to a process of their own) and its
        background writer may not have written it yet (vitrine/feedback/logwriter.py). A search this
        process logged is always there (reads flush the writer first)."""
        ids = list(dict.fromkeys(query_ids))
        logged = self.log.searches(ids)
        pause, waited = 0.02, 0.0
        while waited < WAIT_S:
            fresh = [q for q in ids if q not in logged and now - FRESH_S <= (query_id_time(q) or 0.0) <= now + 1.0]
            if not fresh:
                break
            time.sleep(pause)
            waited += pause
            pause = min(pause * 2, WAIT_S - waited)
            logged.update(self.log.searches(fresh))
        return logged

    def _row(self, where: str, e: EventIn, logged: Mapping[str, SearchLog], now: float,
             client: str | None = None) -> EventRecord:
        """One event checked against its logged search -> the row stored (InvalidInput naming the field)."""
        s = logged.get(e.query_id)
        if s is None:
            made = query_id_time(e.query_id)
            if made is not None and made < now - self.retention_s:
                raise InvalidInput(f"{where}.query_id: search {e.query_id!r} is older than the retention of "
                                   f"{self.settings.events_retention_days:g} days")
            raise InvalidInput(f"{where}.query_id: unknown query_id {e.query_id!r} (not a logged search)")
        if s.ts < now - self.retention_s:
            raise InvalidInput(f"{where}.query_id: search {e.query_id!r} is older than the retention of "
                               f"{self.settings.events_retention_days:g} days")
        rank = s.rank_of(e.product_id)
        if rank is None:
            raise InvalidInput(f"{where}.product_id: product {e.product_id!r} was not on the page of search "
                               f"{e.query_id!r}")
        ts = e.timestamp if e.timestamp is not None and s.ts - 5 <= e.timestamp <= now + 60 else now
        user = self.log.hash_user(e.user) or s.user
        return EventRecord(
            event_id=e.event_id or event_key(e.query_id, e.type, e.product_id, e.user, e.timestamp),
            query_id=e.query_id, type=e.type, product_id=e.product_id, position=rank, ts=ts, user=user,
            session=e.session or s.session, client=client)

    def popular_queries(self, limit: int = 500) -> list[tuple[str, float]]:
        """Logged queries shoppers chose from (clicks, carts, purchases), by distinct clients: at
        least ``suggest_min_clients`` of them, never a query that found nothing, one that holds a
        blocked term (vitrine/feedback/blocklist.py) or a bot's choice (suggestions)."""
        terms = Blocklist(self.log).terms()
        got = self.log.popular_queries(time.time() - self.retention_s, self.settings.suggest_min_clients,
                                       limit + len(terms) * 10, self.settings.bot_events_per_minute)
        return [(q, n) for q, n in got if not blocked(normalise_query(q), terms)][:limit]

    def purge(self) -> int:
        """Forget what is older than the retention (the server runs it on a schedule:
        ``events_purge_interval_s``, vitrine/web/lifecycle.py; ``vitrine events purge`` by hand)."""
        return self.log.purge(time.time() - self.retention_s)


# -- learned per-query re-ranking ------------------------------------------------------------------
@dataclass
class LearnedTable:
    """Per normalised query: product id -> evidence score (standard units: 0 = as expected at its
    position, positive = chosen more, negative = passed over), with how much evidence stands
    behind the query. ``half_life_s`` and ``created`` make boosts fade as they age."""

    queries: dict[str, dict[str, float]] = field(default_factory=dict)
    users: dict[str, int] = field(default_factory=dict)
    created: float = 0.0
    half_life_s: float = 30 * 86400.0
    report: dict[str, Any] = field(default_factory=dict)
    ranker: ltr.Ranker | None = None  # the learned ranker served with the table (vitrine/feedback/ltr.py)

    def to_json(self) -> dict[str, Any]:
        return {"format": LEARNED_FORMAT, "created": self.created, "half_life_s": self.half_life_s,
                "queries": self.queries, "users": self.users, "report": self.report,
                "ranker": ltr.DIR if self.ranker is not None else None}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "LearnedTable":
        if d.get("format") != LEARNED_FORMAT:
            raise ValueError(f"learned file format {d.get('format')!r}, this Vitrine reads {LEARNED_FORMAT}")
        queries = {str(q): {str(p): float(v) for p, v in b.items()} for q, b in (d.get("queries") or {}).items()}
        return cls(queries=queries, users={str(k): int(v) for k, v in (d.get("users") or {}).items()},
                   created=float(d.get("created") or 0.0), half_life_s=float(d.get("half_life_s") or 30 * 86400.0),
                   report=dict(d.get("report") or {}))

    def decay(self, now: float | None = None) -> float:
        """How much of its weight the table keeps now (it halves every ``half_life_s``)."""
        age = max(0.0, (now or time.time()) - self.created)
        return 0.5 ** (age / self.half_life_s)


def save_learned(data_dir: Path, table: LearnedTable) -> Path:
    """``learned.json`` in ``data_dir``, its ranker first (``ltr/``: what the table names is on disk
    before the table is, so a worker that re-reads the table finds its ranker)."""
    if table.ranker is not None:
        table.ranker.created = table.created
        table.ranker.save(Path(data_dir) / ltr.DIR)
    p = Path(data_dir) / LEARNED_FILE
    atomic_write_bytes(p, json.dumps(table.to_json(), ensure_ascii=False, sort_keys=True).encode())
    return p


def load_learned(data_dir: Path) -> LearnedTable | None:
    p = Path(data_dir) / LEARNED_FILE
    if not p.is_file():
        return None
    try:
        d = json.loads(p.read_text())
        table = LearnedTable.from_json(d)
    except (OSError, ValueError, TypeError, AttributeError) as e:
        log.warning("%s unusable (%s): no learned re-ranking", p, e)
        return None
    if d.get("ranker"):
        try:
            ranker = ltr.load(Path(data_dir) / str(d["ranker"]))
            if abs(ranker.created - table.created) > 1e-6:
                raise ValueError("it was saved with another table")
            table.ranker = ranker
        except (OSError, ValueError, TypeError, KeyError) as e:  # the table serves without it
            log.warning("learned ranker in %s unusable (%s): the table serves without it", data_dir, e)
    return table


def rerank(scored: Ranked, boosts: Mapping[int, float], weight: float) -> Ranked:
    """``scored`` (best first) re-ordered by each product's score moved by ``weight`` times its
    evidence, in units of the pool's top score spread (the gap between its best and its 50th
    score, so a boost means the same on any catalogue's score scale). Products without evidence
    keep their order among themselves. The scores themselves stay where they were (the n-th hit
    gets the n-th best score), so the relevance floor, totals and facet counts are the same as
    without learning: learning re-orders, it does not change what matches."""
    if not scored or not boosts or weight <= 0 or not any(i in boosts for i, _, _ in scored):
        return scored
    top = [float(s) for _, s, _ in scored[:50]]
    spread = max(top[0] - top[-1], 1e-6)
    keyed = [(float(s) + weight * spread * boosts.get(iid, 0.0), n) for n, (iid, s, _) in enumerate(scored)]
    keyed.sort(key=lambda t: (-t[0], t[1]))
    out = []
    for (_, n), (_, score, _) in zip(keyed, scored):
        iid, _, parts = scored[n]
        b = boosts.get(iid)
        out.append((iid, score, {**parts, "learned": round(float(b), 6)} if b else parts))
    return out


class LearnedQueries:
    """The data dir's learned table, re-read when its file changes (checked at most once a second),
    resolved to index ids on first use of each query. A thread may :meth:`pin` another table for
    its own searches (learning compares a candidate with what serves); other threads' searches
    keep the file's."""

    def __init__(self, data_dir: Path, settings: FeedbackSettings) -> None:
        self.path = Path(data_dir) / LEARNED_FILE
        self.data_dir = Path(data_dir)
        self.settings = settings
        self._lock = threading.Lock()
        self._file: WatchedFile[LearnedTable | None] = WatchedFile(self.path, lambda: load_learned(self.data_dir), None)
        self._resolved_for: LearnedTable | None = None  # the file's table that _resolved belongs to
        self._resolved: dict[str, dict[int, float]] = {}  # the file's table, resolved per query
        self._local = threading.local()  # .pinned: (table,) while this thread judges one

    def pin(self, table: LearnedTable | None) -> None:
        """Serve ``table`` (None: no learning) to this thread's searches until :meth:`unpin`."""
        self._local.pinned = (table,)

    def unpin(self) -> None:
        self._local.pinned = None

    def capture(self, on: bool) -> list[tuple[str, list[ltr.Row]]]:
        """Start (``on``) or stop collecting this thread's searches' ranker rows (query, its pool's
        rows, as the learned stage builds them), for training a ranker; returns what was collected."""
        got: list[tuple[str, list[ltr.Row]]] = getattr(self._local, "captured", None) or []
        self._local.captured = [] if on else None
        return got

    def captured(self) -> list[tuple[str, list[ltr.Row]]] | None:
        """Where this thread's searches put their ranker rows (None: not collecting)."""
        got: list[tuple[str, list[ltr.Row]]] | None = getattr(self._local, "captured", None)
        return got

    def reload(self) -> None:
        """Read the file again at the next search (after writing it)."""
        self._file.invalidate()

    def table(self) -> LearnedTable | None:
        """The table this thread's searches use: its pinned one, else the file's."""
        pinned = getattr(self._local, "pinned", None)
        if pinned is not None:
            return pinned[0]
        return self._file.get()

    def boosts_for(self, text: str | None, resolve: Resolver) -> dict[int, float]:
        """Index id -> evidence for this query's products (empty: not a learned head query)."""
        if not text or self.settings.learn_weight <= 0:
            return {}
        pinned = getattr(self._local, "pinned", None) is not None
        table = self.table()
        if table is None:
            return {}
        norm = normalise_query(text)
        got = table.queries.get(norm)
        if not got:
            return {}
        cached = None
        if not pinned:
            with self._lock:
                if table is not self._resolved_for:  # the file changed: resolve its table afresh
                    self._resolved_for, self._resolved = table, {}
                cached = self._resolved.get(norm)
        if cached is None:
            iids = resolve(list(got))
            cached = {iids[p]: v for p, v in got.items() if p in iids}
            if not pinned:
                with self._lock:
                    if table is self._resolved_for:
                        self._resolved[norm] = cached
        fade = table.decay()
        return {i: v * fade for i, v in cached.items()}
