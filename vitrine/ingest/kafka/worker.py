"""The ingest worker: one member of the consumer group applying catalogue events to an engine
(the write path of one batch is in the package docstring and docs/kafka.md).

The worker runs the loop; its parts do the rest: :mod:`~vitrine.ingest.kafka.apply` applies a
batch to the engine, :mod:`~vitrine.ingest.kafka.delivery` talks to Kafka (clients, reconnects,
partitions, dead letters, commits), :mod:`~vitrine.ingest.kafka.snapshots` saves index snapshots,
:mod:`~vitrine.ingest.kafka.status` counts and writes the status."""

from __future__ import annotations

import logging
import os
import signal
import socket
import sqlite3
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from vitrine.errors import StorageError
from vitrine.ingest.kafka.apply import EventApplier
from vitrine.ingest.kafka.client import dlq_topic_for, kafka_module
from vitrine.ingest.kafka.delivery import BrokerLost, Delivery
from vitrine.ingest.kafka.snapshots import Snapshots
from vitrine.ingest.kafka.status import STATUS_DIR, StatusFile, WorkerStats
from vitrine.search.engine import Engine
from vitrine.settings import Settings

log = logging.getLogger(__name__)


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
        self.batch_size = s.ingest.kafka_batch_size
        self.status_dir = status_dir if status_dir is not None else engine.data_dir / STATUS_DIR
        self.status_file = StatusFile(self.status_dir, self.group, self.worker_id, status_interval_s)
        self.status_path = self.status_file.path
        self.stats = WorkerStats()
        self.state = "idle"
        self._stop = threading.Event()
        self._started = time.time()
        self.delivery = Delivery(s, self.stats, topic=self.topic, group=self.group, dlq_topic=self.dlq_topic,
                                 worker_id=self.worker_id, create_topics=create_topics, batch_size=self.batch_size,
                                 stop=self._stop, set_state=self._set_state)
        self.applier = EventApplier(engine, s, self.stats)
        self.snapshots = Snapshots(engine, s, self.stats)

    @property
    def connected(self) -> bool:
        return self.delivery.connected

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
        self.delivery.leaving = False
        deadline = time.monotonic() + timeout if timeout else None
        timed_out = False
        idle_since: float | None = None
        backoff = 0.5
        self.status_file.prune()
        self._set_state("connecting")
        try:
            while not self._stop.is_set():
                if deadline is not None and time.monotonic() > deadline:
                    log.warning("ingest worker timed out after %.0fs", timeout)
                    timed_out = True
                    break
                if self.delivery.consumer is None:
                    if not self.delivery.connect():
                        self._stop.wait(backoff)
                        backoff = min(backoff * 2, 10.0)
                        continue
                    backoff = 0.5
                try:
                    records = self.delivery.consumer.poll(timeout_ms=self.settings.ingest.kafka_poll_timeout_ms,
                                                  max_records=self.batch_size)
                    self.delivery.check_log_resets()
                    if records:
                        idle_since = None
                        self._handle(records)
                    else:
                        self.delivery.commit_pending()
                        self.delivery.check_liveness()
                        if until_idle is not None and self.delivery.caught_up():
                            idle_since = idle_since or time.monotonic()
                            if time.monotonic() - idle_since >= until_idle:
                                break
                        else:
                            idle_since = None
                    self.snapshots.maybe()
                except BrokerLost as e:
                    self.delivery.reconnect(str(e))
                except (k.errors.KafkaError, OSError) as e:
                    if isinstance(e, OSError) and not isinstance(e, (ConnectionError, TimeoutError)):
                        raise
                    self.delivery.reconnect(f"{type(e).__name__}: {e}")
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
        batch = self.applier.parse(msgs)
        inputs = self.applier.resolve_photos([ev for _, ev in batch.events])
        try:
            self.applier.apply(batch, inputs)
        except (StorageError, sqlite3.Error, OSError, MemoryError) as e:
            # Not the messages' fault: keep them, rewind, retry the batch later (nothing is committed).
            self.stats.last_error = f"storage: {e}"
            self._set_state("stalled")
            log.error("applying a batch failed (%s); retrying it in 5s", e)
            self.delivery.rewind(records)
            self._stop.wait(5.0)
            return
        applied_at = time.time()
        self.delivery.send_dead_letters(batch.dead)
        self.delivery.mark_durable(records)
        with self.stats.lock:
            st = self.stats
            st.events += len(msgs)
            st.batches += 1
            st.add_window(len(msgs))
            st.last_batch_s = time.monotonic() - t0
            st.busy_s += st.last_batch_s
            if st.first_batch is None:
                st.first_batch = time.time() - st.last_batch_s
            for m, _ in batch.events:
                if m.timestamp is not None and m.timestamp > 0:
                    st.freshness_ms.append(max(0.0, applied_at * 1000 - m.timestamp))
        if self.snapshots.every_batch:
            self.snapshots.maybe(force=True)
        self.delivery.commit_pending()

    def _shutdown(self) -> None:
        self.delivery.leaving = True
        self._set_state("stopping")
        try:
            self.delivery.commit_pending()
        except Exception as e:  # noqa: BLE001 - best effort on the way out
            log.warning("final offset commit failed (%s); those events will be re-read, idempotently", e)
        self.delivery.close_clients()
        try:
            self.snapshots.final()
        finally:
            self.applier.close()
            self.delivery.connected = False
            self._set_state("stopped")
            self._write_status(force=True)

    # -- status -------------------------------------------------------------------------------------
    def _set_state(self, state: str) -> None:
        if state != self.state:
            self.state = state
            self._write_status(force=True)

    def status(self) -> dict[str, Any]:
        """A plain-data snapshot: what ``--status`` prints and /metrics exports."""
        with self.stats.lock:
            parts = self.delivery.partitions()
            known = [v["lag"] for v in parts.values() if v["lag"] is not None]
            return {
                "worker_id": self.worker_id, "pid": os.getpid(), "host": socket.gethostname(),
                "topic": self.topic, "group": self.group, "dlq_topic": self.dlq_topic,
                "bootstrap": self.settings.ingest.kafka_bootstrap, "data_dir": str(self.engine.data_dir),
                "state": self.state, "connected": self.connected, "started": self._started, "updated": time.time(),
                "partitions": parts, "lag": sum(known) if known else None,
                **self.stats.counters(),
                "products": len(self.engine),
            }

    def _write_status(self, force: bool = False) -> None:
        self.status_file.write(self.status, force)
