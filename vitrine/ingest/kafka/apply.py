"""Applying one batch of catalogue and shopper events to an engine: parse each message (a bad one
becomes a dead letter), fetch product photos, apply upserts, patches and deletes in segments in
which every product appears once, and store shopper events in the feedback log.

Storage errors (the record store, the disk, memory) propagate: they are not the messages' fault,
and the worker retries the batch. Anything a single record tickles is isolated to that record."""

from __future__ import annotations

import logging
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from vitrine.errors import InvalidInput, NotFound, StorageError
from vitrine.ingest.catalog import PhotoResolver
from vitrine.ingest.events import BadEvent, DeleteEvent, PatchEvent, ShopperEvent, UpsertEvent, parse_event
from vitrine.ingest.kafka.status import WorkerStats
from vitrine.merchandising import patch
from vitrine.search.engine import Engine
from vitrine.search.writes import ProductInput
from vitrine.search.models import ItemError, UpsertReport
from vitrine.settings import Settings

log = logging.getLogger(__name__)

CatalogueEvent = UpsertEvent | DeleteEvent | PatchEvent


@dataclass
class DeadLetter:
    msg: Any  # kafka ConsumerRecord
    kind: str
    reason: str


@dataclass
class ParsedBatch:
    """A batch's messages sorted: catalogue events, shopper events, and dead letters so far."""
    events: list[tuple[Any, CatalogueEvent]]
    shopper: list[tuple[Any, ShopperEvent]]
    dead: list[DeadLetter]


class EventApplier:
    """Applies batches of events to ``engine``, counting the results in ``stats``."""

    def __init__(self, engine: Engine, settings: Settings, stats: WorkerStats) -> None:
        self.engine = engine
        self.stats = stats
        photo_root = settings.ingest.kafka_photo_root
        self._resolver = PhotoResolver(Path(photo_root) if photo_root else Path("/nonexistent-photo-root"),
                                       max_bytes=settings.encoders.max_image_bytes,
                                       timeout_s=settings.ingest.fetch_timeout_s)
        self._photo_root = photo_root

    def close(self) -> None:
        self._resolver.close()

    @staticmethod
    def parse(msgs: list[Any]) -> ParsedBatch:
        out = ParsedBatch([], [], [])
        for m in msgs:
            try:
                parsed = parse_event(m.key, m.value)
            except BadEvent as e:
                out.dead.append(DeadLetter(m, e.kind, e.reason))
                continue
            if isinstance(parsed, ShopperEvent):
                out.shopper.append((m, parsed))
            else:
                out.events.append((m, parsed))
        return out

    def apply(self, batch: ParsedBatch, inputs: list[ProductInput | None]) -> None:
        """Apply a parsed batch (``inputs``: :meth:`resolve_photos` of its catalogue events)."""
        events, dead = batch.events, batch.dead
        # Segments in which every product appears once: within one, upserts and deletes commute;
        # across them, each product's events apply in log order.
        seg: list[int] = []
        ids: set[str] = set()
        for i, (_, ev) in enumerate(events):
            if ev.id in ids:
                self._apply([events[j] for j in seg], [inputs[j] for j in seg], dead)
                seg, ids = [], set()
            seg.append(i)
            ids.add(ev.id)
        self._apply([events[j] for j in seg], [inputs[j] for j in seg], dead)
        if batch.shopper:
            self._apply_shopper(batch.shopper, dead)

    def resolve_photos(self, events: list[CatalogueEvent]) -> list[ProductInput | None]:
        out: list[ProductInput | None] = [None] * len(events)
        fetch: list[tuple[int, UpsertEvent]] = []
        for i, ev in enumerate(events):
            if isinstance(ev, UpsertEvent):
                p = ev.product
                if p.image_b64 or not p.image:
                    out[i] = ProductInput(p)
                else:
                    fetch.append((i, ev))
        if fetch:
            with ThreadPoolExecutor(max_workers=min(8, len(fetch))) as pool:
                for (i, _), it in zip(fetch, pool.map(self._fetch, [ev for _, ev in fetch])):
                    out[i] = it
        return out

    def _fetch(self, ev: UpsertEvent) -> ProductInput:
        p = ev.product
        ref = p.image or ""
        scheme = urlparse(ref).scheme
        if scheme not in ("http", "https") and self._photo_root is None:
            return ProductInput(p, image_error=f"photo {ref!r} is a local path but this worker has no photo root "
                                               "(kafka_photo_root); send image_b64 or a URL")
        try:
            return ProductInput(p, image=self._resolver.fetch(ref))
        except InvalidInput as e:
            return ProductInput(p, image_error=str(e))
        except OSError as e:
            return ProductInput(p, image_error=f"photo {ref!r} unreadable: {e}")

    def _apply(self, seg: list[tuple[Any, CatalogueEvent]], inputs: list[ProductInput | None],
               dead: list[DeadLetter]) -> None:
        ups = [(m, ev, it) for (m, ev), it in zip(seg, inputs) if isinstance(ev, UpsertEvent)]
        dels = [(m, ev) for m, ev in seg if isinstance(ev, DeleteEvent)]
        if ups:
            items = [it for _, _, it in ups]
            try:
                rep = self.engine.upsert(items)  # type: ignore[arg-type]
            except (StorageError, sqlite3.Error, OSError, MemoryError):
                raise
            except Exception:  # a record tickled a bug: isolate it, keep the rest
                log.exception("a batch of %d upserts failed; applying them one by one", len(items))
                rep = UpsertReport()
                for _, ev, it in ups:
                    try:
                        rep.merge(self.engine.upsert([it]))  # type: ignore[list-item]
                    except (StorageError, sqlite3.Error, OSError, MemoryError):
                        raise
                    except Exception as e:  # noqa: BLE001
                        rep.failed.append(ItemError(id=ev.id, reason=f"internal error: {type(e).__name__}: {e}"))
            failed = {f.id: f.reason for f in rep.failed}
            for m, ev, _ in ups:
                if ev.id in failed:
                    reason = failed[ev.id]
                    dead.append(DeadLetter(m, "internal" if reason.startswith("internal") else "photo", reason))
            with self.stats.lock:
                self.stats.applied["upserted"] += rep.upserted
                self.stats.applied["unchanged"] += rep.unchanged
                self.stats.applied["stale"] += rep.stale
        patches = [(m, ev) for m, ev in seg if isinstance(ev, PatchEvent)]
        for m, pev in patches:  # partial updates: nothing encoded unless text or photo changed
            try:
                prep = patch.patch_product(self.engine.writes, pev.id, pev.patch_fields())
            except (InvalidInput, NotFound) as e:
                dead.append(DeadLetter(m, "schema", f"patch: {e}"))
                continue
            with self.stats.lock:
                self.stats.applied["upserted" if prep.patched else "stale" if prep.stale else "unchanged"] += 1
        if dels:
            n = self.engine.delete([ev.id for _, ev in dels], [ev.version for _, ev in dels])
            with self.stats.lock:
                self.stats.applied["deleted"] += n
                self.stats.applied["delete_noop"] += len(dels) - n

    def _apply_shopper(self, shopper: list[tuple[Any, ShopperEvent]], dead: list[DeadLetter]) -> None:
        """Shopper events -> the feedback log (one transaction, durable when it returns; an event
        already stored, same event_id, is not stored again); an invalid one (unknown query_id, a
        product not on that page, ...) -> a dead letter whose reason names the field."""
        accepted, new, bad = self.engine.record_valid_events([ev.event for _, ev in shopper])
        for i, reason in bad:
            dead.append(DeadLetter(shopper[i][0], "schema", reason))
        with self.stats.lock:
            self.stats.applied["events_stored"] += new
            self.stats.applied["events_duplicate"] += accepted - new
