"""Worker status: the status files workers write under ``<data dir>/kafka/``, the group's lag as
the brokers see it, and reading a dead-letter topic."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import socket
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

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
