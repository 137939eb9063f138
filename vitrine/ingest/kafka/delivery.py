"""A worker's side of Kafka: the clients (created, recreated after broker trouble, closed), the
group's partitions and the worker's positions on them, dead letters, and offset commits.

An offset is committed only once the events before it are durable in the record store; a
partition whose log end falls behind the worker's position (the broker lost its log) is re-read
from the beginning."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from vitrine.ingest.kafka.apply import DeadLetter
from vitrine.ingest.kafka.client import client_options, ensure_topics, kafka_module
from vitrine.ingest.kafka.status import WorkerStats
from vitrine.settings import Settings

log = logging.getLogger(__name__)


class BrokerLost(Exception):
    """The clients must be recreated (broker gone, restarted, or a request timed out)."""


class Delivery:
    """The Kafka clients of one worker and what it knows of its partitions."""

    def __init__(self, settings: Settings, stats: WorkerStats, *, topic: str, group: str, dlq_topic: str,
                 worker_id: str, create_topics: bool, batch_size: int, stop: threading.Event,
                 set_state: Callable[[str], None]) -> None:
        self.settings = settings
        self.stats = stats
        self.topic, self.group, self.dlq_topic, self.worker_id = topic, group, dlq_topic, worker_id
        self.create_topics = create_topics
        self.batch_size = batch_size
        self._stop = stop
        self._set_state = set_state
        self.connected = False
        self.leaving = False  # leaving for good: keep the last positions for the final status
        self.consumer: Any = None
        self._producer: Any = None
        self.pending: dict[Any, int] = {}       # TopicPartition -> next offset, durable but not committed
        self.positions: dict[int, int] = {}     # partition -> next offset to apply
        self.committed: dict[int, int] = {}     # partition -> last committed offset
        self.highwater: dict[int, int] = {}
        self.fetch_pos: dict[int, int] = {}     # partition -> the consumer's position (before any batch)
        self.assigned: list[int] = []
        self._last_liveness = 0.0
        self._seen_heartbeat = False

    # -- after a batch --------------------------------------------------------------------------------
    def rewind(self, records: dict[Any, list[Any]]) -> None:
        """Read a batch again (it could not be applied)."""
        for tp, ms in records.items():
            self.consumer.seek(tp, ms[0].offset)

    def mark_durable(self, records: dict[Any, list[Any]]) -> None:
        """A batch is applied and durable: its offsets may be committed."""
        for tp, ms in records.items():
            self.pending[tp] = ms[-1].offset + 1
            self.positions[tp.partition] = ms[-1].offset + 1

    def send_dead_letters(self, dead: list[DeadLetter]) -> None:
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
                raise BrokerLost(f"dead-letter topic unwritable: {e}") from e
        self._producer.flush(timeout=30)
        for f in futures:
            try:
                f.get(timeout=0)
            except k.errors.KafkaError as e:
                raise BrokerLost(f"dead letter not acknowledged: {e}") from e
        with self.stats.lock:
            for d in dead:
                self.stats.dlq[d.kind] += 1

    def commit_pending(self) -> None:
        if not self.pending or self.consumer is None:
            return
        k = kafka_module()
        assigned = self.consumer.assignment()
        offsets = {tp: k.OffsetAndMetadata(off, "", -1) for tp, off in self.pending.items() if tp in assigned}
        for tp in [tp for tp in self.pending if tp not in assigned]:
            self.pending.pop(tp)  # not ours any more: its new owner re-reads from the committed offset
        if not offsets:
            return
        try:
            self.consumer.commit(offsets=offsets, timeout_ms=10_000)
        except k.errors.CommitFailedError as e:
            # The group moved on (partitions reassigned): the new owner redelivers from the last committed
            # offset, and re-applying is idempotent.
            log.warning("offset commit refused after a rebalance (%s); the new owner re-reads those events", e)
            with self.stats.lock:
                self.stats.commit_failures += 1
            self.pending.clear()
            return
        except (k.errors.RebalanceInProgressError, k.errors.IllegalGenerationError,
                k.errors.UnknownMemberIdError, k.errors.CoordinatorNotAvailableError,
                k.errors.NotCoordinatorError, k.errors.CoordinatorLoadInProgressError) as e:
            log.info("offset commit deferred (%s); retrying after the next poll", type(e).__name__)
            with self.stats.lock:
                self.stats.commit_failures += 1
            return
        except k.errors.KafkaError as e:
            with self.stats.lock:
                self.stats.commit_failures += 1
            raise BrokerLost(f"offset commit failed: {type(e).__name__}: {e}") from e
        with self.stats.lock:
            for tp, om in offsets.items():
                self.committed[tp.partition] = om.offset
                self.pending.pop(tp, None)
            self.stats.commits += 1
            self.stats.last_commit = time.time()

    # -- group membership -------------------------------------------------------------------------------
    def on_revoked(self, revoked: Iterable[Any]) -> None:
        revoked = list(revoked)
        if not revoked:
            return
        log.info("partitions revoked: %s", sorted(tp.partition for tp in revoked))
        try:  # commit what is durable before the partitions move
            self.commit_pending()
        except BrokerLost as e:
            log.warning("could not commit on revocation (%s); the new owner re-reads those events", e)
        if self.leaving:
            return  # leaving for good: keep the last positions for the final status
        for tp in revoked:
            self.pending.pop(tp, None)
            self.positions.pop(tp.partition, None)
            self.highwater.pop(tp.partition, None)
            self.fetch_pos.pop(tp.partition, None)

    def on_assigned(self, assigned: Iterable[Any]) -> None:
        if self.leaving:
            return  # leaving for good: keep the last positions for the final status
        parts = sorted(tp.partition for tp in assigned)
        log.info("partitions assigned: %s", parts)
        with self.stats.lock:
            self.assigned = parts
            self.positions = {}
            self.highwater = {}
            self.fetch_pos = {}

    def check_log_resets(self) -> None:
        """A partition whose log end is behind our position lost its log (e.g. a broker restarted
        without persistent storage): read it again from the beginning."""
        for tp in self.consumer.assignment():
            if tp.partition not in self.positions and tp.partition not in self.fetch_pos:
                try:
                    self.fetch_pos[tp.partition] = self.consumer.position(tp, timeout_ms=50)
                except Exception:  # noqa: BLE001 - not known yet; ask again after the next poll
                    pass
            hw = self.consumer.highwater(tp)
            if hw is None:
                continue
            self.highwater[tp.partition] = hw
            pos = self.positions.get(tp.partition)
            if pos is not None and pos > hw:
                log.warning("partition %d's log ends at %d, before our position %d: the broker lost it; "
                            "re-reading from the beginning", tp.partition, hw, pos)
                self.consumer.seek_to_beginning(tp)
                self.positions.pop(tp.partition, None)
                self.fetch_pos.pop(tp.partition, None)
                self.pending.pop(tp, None)
                self.stats.log_resets += 1

    def check_liveness(self) -> None:
        now = time.monotonic()
        if now - self._last_liveness < 1.0:
            return
        self._last_liveness = now
        try:
            m = self.consumer.metrics().get("consumer-coordinator-metrics", {})
        except Exception:  # noqa: BLE001 - metrics are best effort
            return
        age = m.get("last-heartbeat-seconds-ago")
        if age is None or not math.isfinite(age):
            return
        limit = max(3 * self.settings.ingest.kafka_session_timeout_ms / 1000, 6.0)
        if age < limit:
            self._seen_heartbeat = True
            if not self.connected:
                self.connected = True
        elif self._seen_heartbeat:
            raise BrokerLost(f"no group heartbeat for {age:.0f}s")

    def caught_up(self) -> bool:
        if self.pending or not self.assigned:
            return False
        for p in self.assigned:
            hw, pos = self.highwater.get(p), self.position(p)
            if hw is None or pos is None or pos < hw:
                return False
        return True

    def position(self, p: int) -> int | None:
        """Next offset to apply on partition ``p``, if known."""
        pos = self.positions.get(p)
        return pos if pos is not None else self.fetch_pos.get(p)

    def partitions(self) -> dict[str, dict[str, int | None]]:
        """Position, committed offset, high-water mark and lag of each assigned partition (call
        with the stats' lock held)."""
        parts: dict[str, dict[str, int | None]] = {}
        for p in self.assigned:
            hw, pos = self.highwater.get(p), self.position(p)
            lag = max(0, hw - pos) if hw is not None and pos is not None else None
            parts[str(p)] = {"position": pos, "committed": self.committed.get(p), "highwater": hw, "lag": lag}
        return parts

    # -- connections ---------------------------------------------------------------------------------
    def connect(self) -> bool:
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
            delivery = self
            rebalance_listener: Any = k.ConsumerRebalanceListener  # kafka-python's (untyped) base class

            class Listener(rebalance_listener):
                def on_partitions_revoked(self, revoked: Any) -> None:
                    delivery.on_revoked(revoked)

                def on_partitions_assigned(self, assigned: Any) -> None:
                    delivery.on_assigned(assigned)

            consumer.subscribe([self.topic], listener=Listener())
            self.consumer = consumer
        except (k.errors.KafkaError, OSError) as e:
            self.stats.last_error = f"connect: {type(e).__name__}: {e}"
            log.warning("cannot reach the brokers at %s (%s); retrying", s.ingest.kafka_bootstrap, e)
            self.close_clients()
            self.connected = False
            self._set_state("connecting")
            return False
        self._seen_heartbeat = False
        self.connected = True
        self._set_state("running")
        log.info("worker %s consuming %s as group %s (dead letters -> %s)", self.worker_id, self.topic,
                 self.group, self.dlq_topic)
        return True

    def reconnect(self, why: str) -> None:
        log.warning("recreating the Kafka clients: %s", why)
        with self.stats.lock:
            self.stats.reconnects += 1
            self.stats.last_error = why
        self.close_clients()
        self.pending.clear()  # uncommitted but durable: the new session re-reads them, idempotently
        self.positions.clear()
        self.highwater.clear()
        self.fetch_pos.clear()
        self.assigned = []
        self.connected = False
        self._set_state("reconnecting")
        self._stop.wait(0.5)

    def close_clients(self) -> None:
        c, p = self.consumer, self._producer
        self.consumer = self._producer = None
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
