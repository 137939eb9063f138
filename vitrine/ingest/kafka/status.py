"""Worker status: a worker's counters (:class:`WorkerStats`), the status files workers write under
``<data dir>/kafka/`` (:class:`StatusFile`) and reading them back, the group's lag as the brokers
see it, and reading a dead-letter topic."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from vitrine.atomic import atomic_write_text
from vitrine.ingest.kafka.client import client_options, kafka_module
from vitrine.settings import Settings

log = logging.getLogger(__name__)

STATUS_DIR = "kafka"
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def status_file_name(group: str, worker_id: str) -> str:
    """``<group>.<worker id>.json`` with anything unsafe in a file name replaced."""
    return f"{_SAFE.sub('_', group)}.{_SAFE.sub('_', worker_id)}.json"


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return float(v[min(len(v) - 1, max(0, math.ceil(q / 100 * len(v)) - 1))])


def read_status(data_dir: str | os.PathLike[str], group: str | None = None) -> list[dict[str, Any]]:
    """The status files of the workers that wrote to ``data_dir``: with ``alive`` (the process
    still runs on this host, or wrote recently elsewhere) and ages computed now."""
    return read_status_dir(Path(data_dir) / STATUS_DIR, group)


def read_status_dir(folder: Path, group: str | None = None) -> list[dict[str, Any]]:
    """The status files in ``folder`` (see :func:`read_status`)."""
    out = []
    host = socket.gethostname()
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            st = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if group and st.get("group") != group:
            continue
        now = time.time()
        st["age_s"] = round(now - float(st.get("updated", 0)), 1)
        if st.get("last_commit"):
            st["last_commit_age_s"] = round(now - float(st["last_commit"]), 1)
        if st.get("state") == "stopped":
            alive = False
        elif st.get("host") == host:
            alive = pid_alive(int(st.get("pid", 0)))
        else:
            alive = st["age_s"] < 60
        st["alive"] = alive
        st["status_file"] = str(path)
        out.append(st)
    return out


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def group_lag(settings: Settings, topic: str | None = None, group: str | None = None,
              timeout: float = 5.0) -> dict[int, dict[str, int | None]]:
    """The group's committed offsets against each partition's log end, asked of the brokers
    (log ends from a probe fetch's highwater, since Tansu's ListOffsets is wrong)."""
    k = kafka_module()
    topic = topic or settings.ingest.kafka_topic
    group = group or settings.ingest.kafka_group
    admin = k.KafkaAdminClient(**client_options(settings.ingest, "vitrine-status"), request_timeout_ms=10_000)
    try:
        committed = {tp.partition: om.offset for tp, om in admin.list_group_offsets(group).get(group, {}).items()
                     if tp.topic == topic}
    finally:
        admin.close()
    probe = k.KafkaConsumer(**client_options(settings.ingest, "vitrine-status"), enable_auto_commit=False)
    try:
        parts = sorted(probe.partitions_for_topic(topic) or [])
        tps = [k.TopicPartition(topic, p) for p in parts]
        hw: dict[int, int | None] = {p: None for p in parts}
        if tps:
            probe.assign(tps)
            for tp in tps:
                probe.seek(tp, max(0, committed.get(tp.partition, 0) - 1))
            t_end = time.monotonic() + timeout
            while time.monotonic() < t_end and any(v is None for v in hw.values()):
                probe.poll(timeout_ms=200, max_records=1)
                for tp in tps:
                    if hw[tp.partition] is None:
                        hw[tp.partition] = probe.highwater(tp)
    finally:
        probe.close(autocommit=False)
    out: dict[int, dict[str, int | None]] = {}
    for p in parts:
        c, h = committed.get(p), hw[p]
        out[p] = {"committed": c, "highwater": h,
                  "lag": (h - (c or 0)) if h is not None else None}
    return out


def iter_dead_letters(settings: Settings, dlq_topic: str, *, timeout: float = 10.0,
                      expect: int | None = None) -> Iterator[dict[str, Any]]:
    """Read a dead-letter topic from the beginning (no group): key, value and the reason headers."""
    k = kafka_module()
    c = k.KafkaConsumer(**client_options(settings.ingest, "vitrine-dlq-reader"), enable_auto_commit=False)
    try:
        parts = c.partitions_for_topic(dlq_topic) or set()
        tps = [k.TopicPartition(dlq_topic, p) for p in sorted(parts)]
        if not tps:
            return
        c.assign(tps)
        c.seek_to_beginning(*tps)
        n = 0
        t_end = time.monotonic() + timeout
        while time.monotonic() < t_end and (expect is None or n < expect):
            for _, ms in c.poll(timeout_ms=300).items():
                for m in ms:
                    n += 1
                    h = {key: v.decode("utf-8", "replace") for key, v in (m.headers or [])}
                    yield {"key": m.key, "value": m.value, "reason": h.get("vitrine.reason"),
                           "kind": h.get("vitrine.kind"), "partition": m.partition, "offset": m.offset,
                           "source": (h.get("vitrine.topic"), h.get("vitrine.partition"), h.get("vitrine.offset"))}
    finally:
        c.close(autocommit=False)


class WorkerStats:
    """A worker's counters since it started; ``lock`` guards them and the partition positions the
    status reports."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
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

    def counters(self) -> dict[str, Any]:
        """The counters as the status reports them (call with ``lock`` held)."""
        fresh = list(self.freshness_ms)
        now = time.time()
        return {
            "events": self.events, "applied": dict(self.applied), "dlq": sum(self.dlq.values()),
            "dlq_by_kind": dict(self.dlq), "events_per_s": round(self.rate(), 3), "batches": self.batches,
            "last_batch_s": self.last_batch_s, "busy_s": round(self.busy_s, 3), "first_batch": self.first_batch,
            "commits": self.commits, "commit_failures": self.commit_failures,
            "last_commit": self.last_commit,
            "last_commit_age_s": round(now - self.last_commit, 3) if self.last_commit else None,
            "reconnects": self.reconnects, "log_resets": self.log_resets, "snapshots": self.snapshots,
            "last_snapshot": self.last_snapshot, "last_error": self.last_error,
            "freshness_ms": {"p50": percentile(fresh, 50), "p99": percentile(fresh, 99), "n": len(fresh)},
        }


class StatusFile:
    """A worker's status file, ``<status dir>/<group>.<worker id>.json``, rewritten atomically at
    most every ``interval_s`` (unless forced) for ``vitrine consume --status``."""

    def __init__(self, status_dir: Path, group: str, worker_id: str, interval_s: float) -> None:
        self.status_dir = status_dir
        self.path = status_dir / status_file_name(group, worker_id)
        self.interval_s = interval_s
        self._last_write = 0.0

    def prune(self, older_than_s: float = 86_400) -> None:
        """Forget workers that stopped (or died) more than a day ago."""
        for st in read_status_dir(self.status_dir):
            if not st["alive"] and st["age_s"] > older_than_s:
                Path(st["status_file"]).unlink(missing_ok=True)

    def write(self, status: Callable[[], dict[str, Any]], force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_write < self.interval_s:
            return
        self._last_write = now
        try:
            atomic_write_text(self.path, json.dumps(status(), indent=1, default=str), fsync=False)
        except OSError as e:
            log.debug("status file not written: %s", e)
