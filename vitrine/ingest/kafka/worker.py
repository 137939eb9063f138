"""The ingest worker: one member of the consumer group applying catalogue events to an engine
(the write path of one batch is in the package docstring and docs/kafka.md)."""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import socket
import sqlite3
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from vitrine.atomic import atomic_write_text
from vitrine.errors import InvalidInput, NotFound, StorageError
from vitrine.ingest.catalog import PhotoResolver
from vitrine.ingest.events import BadEvent, DeleteEvent, PatchEvent, ShopperEvent, UpsertEvent, parse_event
from vitrine.ingest.kafka.client import client_options, dlq_topic_for, ensure_topics, kafka_module
from vitrine.ingest.kafka.status import STATUS_DIR, percentile, read_status_dir, status_file_name
from vitrine.search import patch
from vitrine.search.engine import Engine, ProductInput
from vitrine.search.models import ItemError, UpsertReport
from vitrine.settings import Settings

log = logging.getLogger(__name__)


@dataclass
class DeadLetter:
    msg: Any  # kafka ConsumerRecord
    kind: str
    reason: str


class _BrokerLost(Exception):
    """The clients must be recreated (broker gone, restarted, or a request timed out)."""


class _Stats:
    def __init__(self) -> None:
        self.events = 0
        self.applied: Counter[str] = Counter()
        self.dlq: Counter[str] = Counter()
        self.batches = 0
        self.commits = 0
        self.commit_failures = 0
        self.reconnects = 0
        self.log_resets = 0
        self.snapshots = 0
        self.last_commit: float | None = None
        self.last_snapshot: float | None = None
        self.last_batch_s: float | None = None
        self.busy_s = 0.0
        self.first_batch: float | None = None
        self.last_error: str | None = None
        self.window: deque[tuple[float, int]] = deque()
        self.freshness_ms: deque[float] = deque(maxlen=2000)

    def add_window(self, n: int) -> None:
        now = time.monotonic()
        self.window.append((now, n))
        while self.window and now - self.window[0][0] > 30:
            self.window.popleft()

    def rate(self) -> float:
        now = time.monotonic()
        while self.window and now - self.window[0][0] > 30:
            self.window.popleft()
        if not self.window:
            return 0.0
        span = max(now - self.window[0][0], 1.0)
        return sum(n for _, n in self.window) / span


class IngestWorker:
    """One member of the ingest consumer group, applying events to ``engine``.

    ``run()`` blocks until :meth:`stop` (or SIGTERM/SIGINT after
    :meth:`install_signal_handlers`), or with ``until_idle`` until it has been caught up that
    long. Safe to run in a thread beside an API serving the same engine.
    """

    def __init__(self, engine: Engine, settings: Settings | None = None, *, topic: str | None = None,
                 group: str | None = None, dlq_topic: str | None = None, worker_id: str | None = None,
                 status_dir: Path | None = None, create_topics: bool = True, status_interval_s: float = 0.5) -> None:
        self.engine = engine
        self.settings = s = settings or engine.settings
        self.topic = topic or s.ingest.kafka_topic
        self.group = group or s.ingest.kafka_group
        self.dlq_topic = dlq_topic or dlq_topic_for(s.ingest, self.topic)
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.create_topics = create_topics
        self.batch_size = s.ingest.kafka_batch_size
        self.status_dir = status_dir if status_dir is not None else engine.data_dir / STATUS_DIR
        self.status_interval_s = status_interval_s
        self.status_path = self.status_dir / status_file_name(self.group, self.worker_id)
        self.stats = _Stats()
        self.state = "idle"
        self.connected = False
        self._stop = threading.Event()
        self._leaving = False
        self._consumer: Any = None
        self._producer: Any = None
        self._pending: dict[Any, int] = {}      # TopicPartition -> next offset, durable but not committed
        self._positions: dict[int, int] = {}    # partition -> next offset to apply
        self._committed: dict[int, int] = {}    # partition -> last committed offset
        self._highwater: dict[int, int] = {}
        self._fetch_pos: dict[int, int] = {}    # partition -> the consumer's position (before any batch)
        self._assigned: list[int] = []
        self._lock = threading.Lock()
        self._started = time.time()
        self._last_status_write = 0.0
        self._last_liveness = 0.0
        self._seen_heartbeat = False
        self._last_snapshot_mono = time.monotonic()
        photo_root = s.ingest.kafka_photo_root
        self._resolver = PhotoResolver(Path(photo_root) if photo_root else Path("/nonexistent-photo-root"),
                                       max_bytes=s.encoders.max_image_bytes, timeout_s=s.ingest.fetch_timeout_s)
        self._photo_root = photo_root

    # -- control ---------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask the worker to finish its batch, commit, and close."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def install_signal_handlers(self) -> dict[int, Any]:
        """SIGTERM/SIGINT -> graceful stop (a second SIGINT interrupts at once). Main thread only.
        Returns the previous handlers, for ``signal.signal`` to put back."""
        def handler(signum: int, _frame: Any) -> None:
            if self._stop.is_set() and signum == signal.SIGINT:
                raise KeyboardInterrupt
            log.info("%s: finishing the batch, committing and closing", signal.Signals(signum).name)
            self.stop()

        return {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}

    # -- the loop -------------------------------------------------------------------------------------
    def run(self, *, until_idle: float | None = None, timeout: float | None = None) -> dict[str, Any]:
        """Consume until stopped. ``until_idle``: return once every assigned partition has been
        caught up (lag 0, nothing pending) for that many seconds. ``timeout``: give up after
        that many seconds in all (the status then says ``timed_out``). Returns the final status."""
        k = kafka_module()
        self._leaving = False
        deadline = time.monotonic() + timeout if timeout else None
        timed_out = False
        idle_since: float | None = None
        backoff = 0.5
        self._prune_status_files()
        self._set_state("connecting")
        try:
            while not self._stop.is_set():
                if deadline is not None and time.monotonic() > deadline:
                    log.warning("ingest worker timed out after %.0fs", timeout)
                    timed_out = True
                    break
                if self._consumer is None:
                    if not self._connect():
                        self._stop.wait(backoff)
                        backoff = min(backoff * 2, 10.0)
                        continue
                    backoff = 0.5
                try:
                    records = self._consumer.poll(timeout_ms=self.settings.ingest.kafka_poll_timeout_ms,
                                                  max_records=self.batch_size)
                    self._check_log_resets()
                    if records:
                        idle_since = None
                        self._handle(records)
                    else:
                        self._commit_pending()
                        self._check_liveness()
                        if until_idle is not None and self._caught_up():
                            idle_since = idle_since or time.monotonic()
                            if time.monotonic() - idle_since >= until_idle:
                                break
                        else:
                            idle_since = None
                    self._maybe_snapshot()
                except _BrokerLost as e:
                    self._reconnect(str(e))
                except (k.errors.KafkaError, OSError) as e:
                    if isinstance(e, OSError) and not isinstance(e, (ConnectionError, TimeoutError)):
                        raise
                    self._reconnect(f"{type(e).__name__}: {e}")
                self._write_status()
        except Exception as e:
            self.stats.last_error = f"{type(e).__name__}: {e}"
            log.exception("ingest worker failed; nothing past the last durable batch was committed")
            raise
        finally:
            self._shutdown()
        return {**self.status(), "timed_out": timed_out}

    def _handle(self, records: dict[Any, list[Any]]) -> None:
        t0 = time.monotonic()
        self._set_state("running")
        msgs = [m for tp in records for m in records[tp]]
        dead: list[DeadLetter] = []
        events: list[tuple[Any, UpsertEvent | DeleteEvent]] = []
        shopper: list[tuple[Any, ShopperEvent]] = []
        for m in msgs:
            try:
                parsed = parse_event(m.key, m.value)
            except BadEvent as e:
                dead.append(DeadLetter(m, e.kind, e.reason))
                continue
            if isinstance(parsed, ShopperEvent):
                shopper.append((m, parsed))
            else:
                events.append((m, parsed))
        inputs = self._resolve_photos([ev for _, ev in events])
        try:
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
            if shopper:
                self._apply_shopper(shopper, dead)
        except (StorageError, sqlite3.Error, OSError, MemoryError) as e:
            # Not the messages' fault: keep them, rewind, retry the batch later (nothing is committed).
            self.stats.last_error = f"storage: {e}"
            self._set_state("stalled")
            log.error("applying a batch failed (%s); retrying it in 5s", e)
            for tp, ms in records.items():
                self._consumer.seek(tp, ms[0].offset)
            self._stop.wait(5.0)
            return
        applied_at = time.time()
        self._send_dead_letters(dead)
        for tp, ms in records.items():
            self._pending[tp] = ms[-1].offset + 1
            self._positions[tp.partition] = ms[-1].offset + 1
        with self._lock:
            self.stats.events += len(msgs)
            self.stats.batches += 1
            self.stats.add_window(len(msgs))
            self.stats.last_batch_s = time.monotonic() - t0
            self.stats.busy_s += self.stats.last_batch_s
            if self.stats.first_batch is None:
                self.stats.first_batch = time.time() - self.stats.last_batch_s
            for m, _ in events:
                if m.timestamp is not None and m.timestamp > 0:
                    self.stats.freshness_ms.append(max(0.0, applied_at * 1000 - m.timestamp))
        if self.settings.ingest.kafka_snapshot_interval_s == 0:
            self._maybe_snapshot(force=True)
        self._commit_pending()

    def _resolve_photos(self, events: list[UpsertEvent | DeleteEvent]) -> list[ProductInput | None]:
        out: list[ProductInput | None] = [None] * len(events)
        fetch: list[int] = []
        for i, ev in enumerate(events):
            if isinstance(ev, UpsertEvent):
                p = ev.product
                if p.image_b64 or not p.image:
                    out[i] = ProductInput(p)
                else:
                    fetch.append(i)
        if fetch:
            with ThreadPoolExecutor(max_workers=min(8, len(fetch))) as pool:
                for i, it in zip(fetch, pool.map(lambda j: self._fetch(events[j]), fetch)):  # type: ignore[arg-type]
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

    def _apply(self, seg: list[tuple[Any, UpsertEvent | DeleteEvent]], inputs: list[ProductInput | None],
               dead: list[DeadLetter]) -> None:
        ups = [(m, ev, it) for (m, ev), it in zip(seg, inputs) if isinstance(ev, UpsertEvent)]
        dels = [(m, ev) for m, ev in seg if isinstance(ev, DeleteEvent)]
        if ups:
            items = [it for _, _, it in ups]
            try:
                rep = self.engine.upsert(items)  # type: ignore[arg-type]
            except (StorageError, sqlite3.Error, OSError, MemoryError):
                raise
            except Exception:  # noqa: BLE001 - a record tickled a bug: isolate it, keep the rest
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
            with self._lock:
                self.stats.applied["upserted"] += rep.upserted
                self.stats.applied["unchanged"] += rep.unchanged
                self.stats.applied["stale"] += rep.stale
        patches = [(m, ev) for m, ev in seg if isinstance(ev, PatchEvent)]
        for m, ev in patches:  # partial updates: nothing encoded unless text or photo changed
            try:
                prep = patch.patch_product(self.engine.writes, ev.id, ev.patch_fields())
            except (InvalidInput, NotFound) as e:
                dead.append(DeadLetter(m, "schema", f"patch: {e}"))
                continue
            with self._lock:
                self.stats.applied["upserted" if prep.patched else "stale" if prep.stale else "unchanged"] += 1
        if dels:
            n = self.engine.delete([ev.id for _, ev in dels], [ev.version for _, ev in dels])
            with self._lock:
                self.stats.applied["deleted"] += n
                self.stats.applied["delete_noop"] += len(dels) - n

    def _apply_shopper(self, shopper: list[tuple[Any, ShopperEvent]], dead: list[DeadLetter]) -> None:
        """Shopper events -> the feedback log (one transaction, durable when it returns; an event
        already stored, same event_id, is not stored again); an invalid one (unknown query_id, a
        product not on that page, ...) -> a dead letter whose reason names the field."""
        accepted, new, bad = self.engine.record_valid_events([ev.event for _, ev in shopper])
        for i, reason in bad:
            dead.append(DeadLetter(shopper[i][0], "schema", reason))
        with self._lock:
            self.stats.applied["events_stored"] += new
            self.stats.applied["events_duplicate"] += accepted - new

    def _send_dead_letters(self, dead: list[DeadLetter]) -> None:
        if not dead:
            return
        k = kafka_module()
        futures = []
        for d in dead:
            m = d.msg
            headers = [("vitrine.reason", d.reason.encode("utf-8", "replace")[:4000]),
                       ("vitrine.kind", d.kind.encode()), ("vitrine.topic", m.topic.encode()),
                       ("vitrine.partition", str(m.partition).encode()), ("vitrine.offset", str(m.offset).encode()),
                       ("vitrine.group", self.group.encode()), ("vitrine.worker", self.worker_id.encode())]
            log.warning("dead letter %s[%d]@%d (%s): %s", m.topic, m.partition, m.offset, d.kind, d.reason)
            try:
                futures.append(self._producer.send(self.dlq_topic, key=m.key, value=m.value, headers=headers))
            except k.errors.KafkaError as e:
                raise _BrokerLost(f"dead-letter topic unwritable: {e}") from e
        self._producer.flush(timeout=30)
        for f in futures:
            try:
                f.get(timeout=0)
            except k.errors.KafkaError as e:
                raise _BrokerLost(f"dead letter not acknowledged: {e}") from e
        with self._lock:
            for d in dead:
                self.stats.dlq[d.kind] += 1

    def _commit_pending(self) -> None:
        if not self._pending or self._consumer is None:
            return
        k = kafka_module()
        assigned = self._consumer.assignment()
        offsets = {tp: k.OffsetAndMetadata(off, "", -1) for tp, off in self._pending.items() if tp in assigned}
        for tp in [tp for tp in self._pending if tp not in assigned]:
            self._pending.pop(tp)  # not ours any more: its new owner re-reads from the committed offset
        if not offsets:
            return
        try:
            self._consumer.commit(offsets=offsets, timeout_ms=10_000)
        except k.errors.CommitFailedError as e:
            # The group moved on (partitions reassigned): the new owner redelivers from the last committed
            # offset, and re-applying is idempotent.
            log.warning("offset commit refused after a rebalance (%s); the new owner re-reads those events", e)
            with self._lock:
                self.stats.commit_failures += 1
            self._pending.clear()
            return
        except (k.errors.RebalanceInProgressError, k.errors.IllegalGenerationError,
                k.errors.UnknownMemberIdError, k.errors.CoordinatorNotAvailableError,
                k.errors.NotCoordinatorError, k.errors.CoordinatorLoadInProgressError) as e:
            log.info("offset commit deferred (%s); retrying after the next poll", type(e).__name__)
            with self._lock:
                self.stats.commit_failures += 1
            return
        except k.errors.KafkaError as e:
            with self._lock:
                self.stats.commit_failures += 1
            raise _BrokerLost(f"offset commit failed: {type(e).__name__}: {e}") from e
        with self._lock:
            for tp, om in offsets.items():
                self._committed[tp.partition] = om.offset
                self._pending.pop(tp, None)
            self.stats.commits += 1
            self.stats.last_commit = time.time()

    # -- group membership -------------------------------------------------------------------------------
    def _on_revoked(self, revoked: Iterable[Any]) -> None:
        revoked = list(revoked)
        if not revoked:
            return
        log.info("partitions revoked: %s", sorted(tp.partition for tp in revoked))
        try:  # commit what is durable before the partitions move
            self._commit_pending()
        except _BrokerLost as e:
            log.warning("could not commit on revocation (%s); the new owner re-reads those events", e)
        if self._leaving:
            return  # leaving for good: keep the last positions for the final status
        for tp in revoked:
            self._pending.pop(tp, None)
            self._positions.pop(tp.partition, None)
            self._highwater.pop(tp.partition, None)
            self._fetch_pos.pop(tp.partition, None)

    def _on_assigned(self, assigned: Iterable[Any]) -> None:
        if self._leaving:
            return  # leaving for good: keep the last positions for the final status
        parts = sorted(tp.partition for tp in assigned)
        log.info("partitions assigned: %s", parts)
        with self._lock:
            self._assigned = parts
            self._positions = {}
            self._highwater = {}
            self._fetch_pos = {}

    def _check_log_resets(self) -> None:
        """A partition whose log end is behind our position lost its log (e.g. a broker restarted
        without persistent storage): read it again from the beginning."""
        for tp in self._consumer.assignment():
            if tp.partition not in self._positions and tp.partition not in self._fetch_pos:
                try:
                    self._fetch_pos[tp.partition] = self._consumer.position(tp, timeout_ms=50)
                except Exception:  # noqa: BLE001 - not known yet; ask again after the next poll
                    pass
            hw = self._consumer.highwater(tp)
            if hw is None:
                continue
            self._highwater[tp.partition] = hw
            pos = self._positions.get(tp.partition)
            if pos is not None and pos > hw:
                log.warning("partition %d's log ends at %d, before our position %d: the broker lost it; "
                            "re-reading from the beginning", tp.partition, hw, pos)
                self._consumer.seek_to_beginning(tp)
                self._positions.pop(tp.partition, None)
                self._fetch_pos.pop(tp.partition, None)
                self._pending.pop(tp, None)
                self.stats.log_resets += 1

    def _check_liveness(self) -> None:
        now = time.monotonic()
        if now - self._last_liveness < 1.0:
            return
        self._last_liveness = now
        try:
            m = self._consumer.metrics().get("consumer-coordinator-metrics", {})
        except Exception:  # noqa: BLE001 - metrics are best effort
            return
        age = m.get("last-heartbeat-seconds-ago")
        if age is None or not math.isfinite(age):
            return
        limit = max(3 * self.settings.ingest.kafka_session_timeout_ms / 1000, 6.0)
        if age < limit:
            self._seen_heartbeat = True
            if not self.connected:
                self._set_connected(True)
        elif self._seen_heartbeat:
            raise _BrokerLost(f"no group heartbeat for {age:.0f}s")

    def _caught_up(self) -> bool:
        if self._pending or not self._assigned:
            return False
        for p in self._assigned:
            hw, pos = self._highwater.get(p), self._position(p)
            if hw is None or pos is None or pos < hw:
                return False
        return True

    def _position(self, p: int) -> int | None:
        """Next offset to apply on partition ``p``, if known."""
        pos = self._positions.get(p)
        return pos if pos is not None else self._fetch_pos.get(p)

    # -- connections ---------------------------------------------------------------------------------
    def _connect(self) -> bool:
        k = kafka_module()
        s = self.settings
        try:
            if self.create_topics:
                ensure_topics(s.ingest, [self.topic, self.dlq_topic], bootstrap_timeout_ms=5_000)
            opts = client_options(s.ingest, f"vitrine-{self.worker_id}", bootstrap_timeout_ms=5_000)
            self._producer = k.KafkaProducer(**opts, acks="all", linger_ms=5, max_block_ms=10_000,
                                             request_timeout_ms=15_000)
            session = s.ingest.kafka_session_timeout_ms
            consumer = k.KafkaConsumer(
                **opts, group_id=self.group, enable_auto_commit=False, auto_offset_reset="earliest",
                allow_auto_create_topics=False, session_timeout_ms=session,
                heartbeat_interval_ms=max(100, session // 4), max_poll_interval_ms=s.ingest.kafka_max_poll_interval_ms,
                max_poll_records=self.batch_size, request_timeout_ms=max(30_000, session + 5_000),
            )
            worker = self

            class Listener(k.ConsumerRebalanceListener):
                def on_partitions_revoked(self, revoked: Any) -> None:
                    worker._on_revoked(revoked)

                def on_partitions_assigned(self, assigned: Any) -> None:
                    worker._on_assigned(assigned)

            consumer.subscribe([self.topic], listener=Listener())
            self._consumer = consumer
        except (k.errors.KafkaError, OSError) as e:
            self.stats.last_error = f"connect: {type(e).__name__}: {e}"
            log.warning("cannot reach the brokers at %s (%s); retrying", s.ingest.kafka_bootstrap, e)
            self._close_clients()
            self._set_connected(False)
            self._set_state("connecting")
            return False
        self._seen_heartbeat = False
        self._set_connected(True)
        self._set_state("running")
        log.info("worker %s consuming %s as group %s (dead letters -> %s)", self.worker_id, self.topic,
                 self.group, self.dlq_topic)
        return True

    def _reconnect(self, why: str) -> None:
        log.warning("recreating the Kafka clients: %s", why)
        with self._lock:
            self.stats.reconnects += 1
            self.stats.last_error = why
        self._close_clients()
        self._pending.clear()  # uncommitted but durable: the new session re-reads them, idempotently
        self._positions.clear()
        self._highwater.clear()
        self._fetch_pos.clear()
        self._assigned = []
        self._set_connected(False)
        self._set_state("reconnecting")
        self._stop.wait(0.5)

    def _close_clients(self) -> None:
        c, p = self._consumer, self._producer
        self._consumer = self._producer = None
        if c is not None:
            try:
                c.close(autocommit=False, timeout_ms=3000)
            except Exception as e:  # noqa: BLE001 - closing a broken client
                log.debug("consumer close: %s", e)
        if p is not None:
            try:
                p.close(timeout=3)
            except Exception as e:  # noqa: BLE001
                log.debug("producer close: %s", e)

    def _shutdown(self) -> None:
        self._leaving = True
        self._set_state("stopping")
        try:
            self._commit_pending()
        except Exception as e:  # noqa: BLE001 - best effort on the way out
            log.warning("final offset commit failed (%s); those events will be re-read, idempotently", e)
        self._close_clients()
        try:
            if self.engine.save():
                self.stats.snapshots += 1
                self.stats.last_snapshot = time.time()
        finally:
            self._resolver.close()
            self._set_connected(False)
            self._set_state("stopped")
            self._write_status(force=True)

    def _maybe_snapshot(self, force: bool = False) -> None:
        interval = self.settings.ingest.kafka_snapshot_interval_s
        if not force and (interval == 0 or time.monotonic() - self._last_snapshot_mono < interval):
            return
        self._last_snapshot_mono = time.monotonic()
        try:
            saved = self.engine.save()
        except (StorageError, OSError) as e:  # an optimisation only: the record store is durable
            log.error("index snapshot failed (%s); the record store still holds every change", e)
            return
        if saved:
            with self._lock:
                self.stats.snapshots += 1
                self.stats.last_snapshot = time.time()

    # -- status -------------------------------------------------------------------------------------
    def _set_state(self, state: str) -> None:
        if state != self.state:
            self.state = state
            self._write_status(force=True)

    def _set_connected(self, v: bool) -> None:
        self.connected = v

    def status(self) -> dict[str, Any]:
        """A plain-data snapshot: what ``--status`` prints and /metrics exports."""
        with self._lock:
            st = self.stats
            parts: dict[str, dict[str, int | None]] = {}
            for p in self._assigned:
                hw, pos = self._highwater.get(p), self._position(p)
                lag = max(0, hw - pos) if hw is not None and pos is not None else None
                parts[str(p)] = {"position": pos, "committed": self._committed.get(p), "highwater": hw, "lag": lag}
            known = [v["lag"] for v in parts.values() if v["lag"] is not None]
            fresh = list(st.freshness_ms)
            now = time.time()
            return {
                "worker_id": self.worker_id, "pid": os.getpid(), "host": socket.gethostname(),
                "topic": self.topic, "group": self.group, "dlq_topic": self.dlq_topic,
                "bootstrap": self.settings.ingest.kafka_bootstrap, "data_dir": str(self.engine.data_dir),
                "state": self.state, "connected": self.connected, "started": self._started, "updated": now,
                "partitions": parts, "lag": sum(known) if known else None,
                "events": st.events, "applied": dict(st.applied), "dlq": sum(st.dlq.values()),
                "dlq_by_kind": dict(st.dlq), "events_per_s": round(st.rate(), 3), "batches": st.batches,
                "last_batch_s": st.last_batch_s, "busy_s": round(st.busy_s, 3), "first_batch": st.first_batch,
                "commits": st.commits, "commit_failures": st.commit_failures,
                "last_commit": st.last_commit,
                "last_commit_age_s": round(now - st.last_commit, 3) if st.last_commit else None,
                "reconnects": st.reconnects, "log_resets": st.log_resets, "snapshots": st.snapshots,
                "last_snapshot": st.last_snapshot, "last_error": st.last_error,
                "freshness_ms": {"p50": percentile(fresh, 50), "p99": percentile(fresh, 99), "n": len(fresh)},
                "products": len(self.engine),
            }

    def _prune_status_files(self, older_than_s: float = 86_400) -> None:
        """Forget workers that stopped (or died) more than a day ago."""
        for st in read_status_dir(self.status_dir):
            if not st["alive"] and st["age_s"] > older_than_s:
                Path(st["status_file"]).unlink(missing_ok=True)

    def _write_status(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_status_write < self.status_interval_s:
            return
        self._last_status_write = now
        try:
            atomic_write_text(self.status_path, json.dumps(self.status(), indent=1, default=str), fsync=False)
        except OSError as e:
            log.debug("status file not written: %s", e)
