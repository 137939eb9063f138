"""Publishing catalogue changes: events keyed by product id, ``acks=all``, photos embedded or
referenced (see the package docstring and docs/kafka.md)."""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitrine.errors import InvalidInput
from vitrine.ingest.catalog import PhotoResolver, read_catalog
from vitrine.ingest.events import DeleteEvent, ShopperEvent, UpsertEvent, encode_event, parse_event
from vitrine.ingest.kafka.client import client_options, ensure_topics, kafka_module
from vitrine.progress import progress_bar
from vitrine.search.models import ItemError
from vitrine.settings import Settings

log = logging.getLogger(__name__)



@dataclass
class PublishReport:
    topic: str
    sent: int = 0
    failed: list[ItemError] = field(default_factory=list)
    bytes: int = 0
    seconds: float = 0.0


class Publisher:
    """Events -> the topic, keyed by product id, ``acks=all``. A context manager; ``flush``
    waits until every event is acknowledged and counts failures in :attr:`report`."""

    def __init__(self, settings: Settings, topic: str | None = None, *, create_topic: bool = True,
                 partitions: int | None = None, linger_ms: int = 20) -> None:
        k = kafka_module()
        self.settings = settings
        self.topic = topic or settings.ingest.kafka_topic
        if create_topic:
            ensure_topics(settings.ingest, [self.topic], partitions)
        self._producer = k.KafkaProducer(
            **client_options(settings.ingest, "vitrine-publish"), acks="all", linger_ms=linger_ms,
            max_request_size=max(1_048_576, int(settings.encoders.max_image_bytes * 1.4) + 65_536),
        )
        self.report = PublishReport(topic=self.topic)
        self._lock = threading.Lock()
        self._t0 = time.perf_counter()

    def __enter__(self) -> "Publisher":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, ev: UpsertEvent | DeleteEvent | ShopperEvent, *, line: int | None = None) -> Any:
        """Queue one event; returns kafka-python's future (its RecordMetadata says where it landed)."""
        key, value = encode_event(ev)
        return self.send_raw(key, value, pid=ev.id, line=line)

    def send_raw(self, key: bytes | None, value: bytes | None, *, pid: str | None = None, line: int | None = None,
                 headers: list[tuple[str, bytes]] | None = None) -> Any:
        """Any bytes (tests and tools use it to publish malformed messages on purpose)."""
        k = kafka_module()
        size = len(value or b"")

        def ok(_: Any) -> None:
            with self._lock:
                self.report.sent += 1
                self.report.bytes += size

        def failed(e: BaseException) -> None:
            with self._lock:
                self.report.failed.append(ItemError(id=pid, line=line, reason=f"not published: {e}"))

        try:
            fut = self._producer.send(self.topic, key=key, value=value, headers=headers or None)
        except k.errors.KafkaError as e:  # e.g. MessageSizeTooLargeError, raised before sending
            failed(e)
            return None
        fut.add_callback(ok)
        fut.add_errback(failed)
        return fut

    def flush(self, timeout: float | None = 60.0) -> PublishReport:
        self._producer.flush(timeout=timeout)
        self.report.seconds = time.perf_counter() - self._t0
        return self.report

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._producer.close(timeout=10)


def publish_catalog(settings: Settings, path: str | os.PathLike[str], *, topic: str | None = None,
                    embed_photos: bool = True, version: int | None = None, limit: int | None = None,
                    progress: bool = True, partitions: int | None = None) -> PublishReport:
    """A catalogue file (JSONL/CSV) -> upsert events. With ``embed_photos`` each photo travels
    in the event as ``image_b64`` (consumers need no shared filesystem); otherwise ``image``
    references go as they are (URLs work anywhere, local paths only for workers whose
    ``kafka_photo_root`` is that folder). ``version`` stamps records that carry none."""
    path = Path(path)
    records = read_catalog(path)
    resolver = PhotoResolver(path.parent, max_bytes=settings.encoders.max_image_bytes,
                             timeout_s=settings.ingest.fetch_timeout_s)
    with open(path, "rb") as f:
        total = sum(1 for line in f if line.strip()) - (1 if path.suffix.lower() == ".csv" else 0)
    if limit is not None:
        total = min(total, limit)
    bar: Any = progress_bar(total=total, desc="publish", unit="event", enabled=progress)  # tqdm or NoBar
    skipped: list[ItemError] = []

    def prepare(p: Any) -> tuple[Any, UpsertEvent | ItemError]:
        if p.product is None:
            return p, ItemError(id=p.raw_id, line=p.line, reason=p.error or "invalid record")
        prod = p.product
        if embed_photos and prod.image and not prod.image_b64:
            try:
                data = resolver.fetch(prod.image)
            except (InvalidInput, OSError) as e:
                return p, ItemError(id=prod.id, line=p.line, reason=str(e))
            prod = prod.model_copy(update={"image_b64": base64.b64encode(data).decode("ascii"), "image": None})
        if version is not None and prod.version is None:
            prod = prod.model_copy(update={"version": version})
        return p, UpsertEvent(op="upsert", product=prod)

    try:
        with Publisher(settings, topic, partitions=partitions) as pub, ThreadPoolExecutor(max_workers=8) as pool:
            chunk: list[Any] = []
            n = 0

            def drain() -> None:
                for p, ev in pool.map(prepare, chunk):
                    if isinstance(ev, ItemError):
                        skipped.append(ev)
                    else:
                        pub.send(ev, line=p.line)
                bar.update(len(chunk))
                bar.set_postfix(acked=pub.report.sent, failed=len(skipped) + len(pub.report.failed))
                chunk.clear()

            for p in records:
                if limit is not None and n >= limit:
                    break
                n += 1
                chunk.append(p)
                if len(chunk) >= 64:
                    drain()
            drain()
            report = pub.flush()
    finally:
        bar.close()
        resolver.close()
    report.failed = skipped + report.failed
    return report


def publish_deletes(settings: Settings, ids: Sequence[str], *, topic: str | None = None,
                    version: int | None = None) -> PublishReport:
    with Publisher(settings, topic) as pub:
        for pid in ids:
            pub.send(DeleteEvent(op="delete", id=pid, version=version))
        return pub.flush()


def publish_events(settings: Settings, path: str | os.PathLike[str], *, topic: str | None = None,
                   limit: int | None = None, partitions: int | None = None) -> PublishReport:
    """A JSONL file of shopper events (one a line: the ``POST /v1/events`` event object, or
    ``{"op": "event", "event": {...}}``, or ``{"events": [...]}`` as posted) -> ``op: event``
    messages keyed by ``query_id`` (``acks=all``). A line that is not a valid event is counted in
    ``failed`` (its line number and the field) and not sent."""
    path = Path(path)
    skipped: list[ItemError] = []
    n = 0
    with Publisher(settings, topic, partitions=partitions) as pub, open(path, "rb") as f:
        for no, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                skipped.append(ItemError(id=None, line=no, reason=f"not JSON: {e}"))
                continue
            for item in obj["events"] if isinstance(obj, dict) and isinstance(obj.get("events"), list) else [obj]:
                if limit is not None and n >= limit:
                    break
                try:
                    ev = parse_event(None, json.dumps(item).encode())
                except InvalidInput as e:
                    skipped.append(ItemError(id=None, line=no, reason=str(e)))
                    continue
                if not isinstance(ev, ShopperEvent):
                    skipped.append(ItemError(id=ev.id, line=no, reason=f"op {item.get('op')!r} is not a shopper event"))
                    continue
                n += 1
                pub.send(ev, line=no)
        report = pub.flush()
    report.failed = skipped + report.failed
    return report
