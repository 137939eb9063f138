"""API replicas on one PostgreSQL store, as a user runs them: two `vitrine serve --store URL`
processes with separate local data dirs (nothing shared but the database) and a `vitrine consume
--store URL` Kafka worker with a third. On the tiny test towers (fast to load; the wiring is
under test) and text-only products (photos are not the point).

- a write through either replica, and one through Kafka, is searchable on both;
- a replica killed with SIGKILL while following, restarted on its own data dir, holds every
  product exactly once (nothing lost, nothing duplicated);
- a database restart under search load: every search answers 200 while it is down (from each
  replica's own copy, marked ``degraded: ["store"]``), and writes are taken again by themselves
  once it is back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from kafka_broker import REPO, unique, wait_for

KEY = "replicas-test-key"
N = 40


def _env(tmp_path: Path, url: str) -> dict[str, str]:
    return {**os.environ, "VITRINE_MODEL": "tiny-vit-test", "VITRINE_ADAPTER": "none", "VITRINE_STORE": url,
            "VITRINE_INTENT": "false", "VITRINE_API_KEY": KEY, "VITRINE_CACHE_DIR": str(tmp_path / "cache"),
            "VITRINE_KAFKA_SESSION_TIMEOUT_MS": "2000", "VITRINE_KAFKA_POLL_TIMEOUT_MS": "200",
            "VITRINE_TORCH_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(REPO),
            "VITRINE_TUNE_AFTER_INGEST": "false"}  # tuning is test_tuning's


def _start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    f = open(log, "a")  # the child holds it
    return subprocess.Popen([sys.executable, "-m", "vitrine.cli.__main__", *args], env=env, text=True,
                            stdout=f, stderr=subprocess.STDOUT)


def _stop(p: subprocess.Popen, sig: int = signal.SIGTERM) -> int:
    if p.poll() is None:
        p.send_signal(sig)
        try:
            p.wait(90)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    return p.returncode


def _json(url: str) -> dict | None:
    try:
        r = httpx.get(url, timeout=5)
        return r.json() if r.status_code == 200 else None
    except httpx.HTTPError:
        return None


def _found(url: str, pid: str, title: str) -> bool:
    try:
        r = httpx.post(url + "/search", json={"text": title, "k": 5, "use_intent": False}, timeout=10)
    except httpx.HTTPError:
        return False
    return r.status_code == 200 and pid in [h["id"] for h in r.json()["results"]]


def _store_ids(url: str) -> list[str]:
    from vitrine.index.pgstore import PgRecordStore

    s = PgRecordStore(url)
    try:
        return s.ids()
    finally:
        s.close()


def _store_ids_once_up(url: str, timeout: float = 30) -> list[str]:
    """``_store_ids`` once this process's own health watcher has seen the database again (it probes
    every 0.5 s: right after a restart it can still call the database down, and refuse at once)."""
    from vitrine.errors import StorageError

    def ids() -> list[str] | None:
        try:
            return _store_ids(url)
        except StorageError:
            return None

    return wait_for(ids, timeout, "this process to see the database again", every=0.2)


def test_every_process_builds_the_same_towers(tmp_path):
    """A replica ranks vectors another process wrote (another replica, ingest, a Kafka worker)
    against queries it embeds itself, all under one model key: so every process must build the
    same parameters, also for a config whose weights are not in files (the tiny test towers,
    randomly initialised). They were not: each process drew its own, and a write through one
    replica was in the other's indexes but ranked at random there (issue 27's flaky replica test).
    Another process is simulated by another random state when the model is built."""
    import numpy as np
    import torch

    from vitrine.search.engine import build_encoder
    from vitrine.settings import Settings

    texts = ["replica test saffron blazer", "stream 3 scarf"]
    keys, feats, rng_kept = [], [], []
    for seed in (1, 2):
        torch.manual_seed(seed)
        untouched = torch.rand(1)
        torch.manual_seed(seed)
        enc = build_encoder(Settings(model="tiny-vit-test", adapter="none", data_dir=tmp_path,
                                     cache_dir=tmp_path / f"cache-{seed}", _env_file=None))  # no shared cache
        rng_kept.append(torch.equal(torch.rand(1), untouched))
        keys.append(enc.model_key)
        feats.append(enc.text_features(texts))
    assert keys[0] == keys[1]
    np.testing.assert_array_equal(feats[0], feats[1])
    assert all(rng_kept)  # building a model leaves the caller's random state alone


@pytest.mark.slow
def test_replicas_and_a_kafka_worker_share_one_store(broker, pg_server, pg_url, catalog_dir, tmp_path):
    from vitrine.ingest.kafka.publisher import Publisher
    from vitrine.ingest.events import UpsertEvent
    from vitrine.search.models import Product
    from vitrine.settings import Settings
    from vitrine_bench.common import free_port

    env = _env(tmp_path, pg_url)
    recs = []
    for line in (catalog_dir / "catalog.jsonl").read_text().splitlines()[:N]:
        r = json.loads(line)
        r.pop("image")
        recs.append(r)
    (tmp_path / "catalog.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    done = subprocess.run([sys.executable, "-m", "vitrine.cli.__main__", "ingest", str(tmp_path / "catalog.jsonl"),
                           "--data", str(tmp_path / "ingest")], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]

    topic, group = unique("pg-catalog"), unique("pg-group")
    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    dirs = [tmp_path / "replica-a", tmp_path / "replica-b"]
    procs = [_start(["serve", "--data", str(d), "--port", str(p)], env, tmp_path / f"serve-{i}.log")
             for i, (d, p) in enumerate(zip(dirs, ports))]
    worker = _start(["consume", "--data", str(tmp_path / "worker"), "--topic", topic, "--bootstrap", broker.bootstrap,
                     "--group", group], env, tmp_path / "worker.log")
    try:
        for u in urls:
            wait_for(lambda u=u: (h := _json(u + "/health")) is not None and h["products"] == N, 300,
                     f"{u} to serve the store's products", every=0.5)
        # a write through each replica and one through Kafka: searchable on both replicas
        new = {f"pg-{i}": f"replica test {w} blazer" for i, w in enumerate(("walnut", "saffron", "cobalt"))}
        for (pid, title), u in zip(list(new.items())[:2], urls):
            r = httpx.put(f"{u}/products/{pid}", json={"id": pid, "title": title, "brand": "Acme"},
                          headers={"x-api-key": KEY}, timeout=60)
            assert r.status_code == 200, r.text
        pid, title = list(new.items())[2]
        with Publisher(Settings(kafka_bootstrap=broker.bootstrap, _env_file=None), topic) as pub:
            pub.send(UpsertEvent(op="upsert", product=Product(id=pid, title=title, brand="Acme")))
            assert not pub.flush().failed
        for u in urls:
            for pid, title in new.items():
                wait_for(lambda u=u, pid=pid, title=title: _found(u, pid, title), 120, f"{pid} on {u}", every=0.2)

        # kill -9 replica b while it follows a stream of writes through a; restart it on its own dir
        stop = threading.Event()
        written: list[str] = []

        def writes() -> None:
            n = 0
            while not stop.is_set():
                pid = f"pg-w{n}"
                r = httpx.put(f"{urls[0]}/products/{pid}", json={"id": pid, "title": f"stream {n} scarf"},
                              headers={"x-api-key": KEY}, timeout=60)
                if r.status_code == 200:
                    written.append(pid)
                n += 1
                time.sleep(0.05)

        t = threading.Thread(target=writes)
        t.start()
        time.sleep(2.0)
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait()
        time.sleep(1.0)
        httpx.delete(f"{urls[0]}/products/pg-0", headers={"x-api-key": KEY}, timeout=60)
        stop.set()
        t.join()
        assert written
        procs[1] = _start(["serve", "--data", str(dirs[1]), "--port", str(ports[1])], env, tmp_path / "serve-1.log")
        want = sorted(_store_ids(pg_url))
        assert "pg-0" not in want and set(written) <= set(want)
        for u in urls:
            wait_for(lambda u=u: (h := _json(u + "/health")) is not None and h["products"] == len(want), 300,
                     f"{u} to hold every product once", every=0.5)
        for pid in (written[0], written[-1], "pg-1", "pg-2"):
            assert httpx.get(f"{urls[1]}/products/{pid}", timeout=10).status_code == 200
        assert httpx.get(f"{urls[1]}/products/pg-0", timeout=10).status_code == 404

        # the database restarts under search load: every search answers (degraded while it is down)
        codes: Counter = Counter()
        stop.clear()

        def load(u: str) -> None:
            with httpx.Client(timeout=30) as c:
                while not stop.is_set():
                    try:
                        r = c.post(u + "/search", json={"text": "blazer", "k": 5})
                        codes[r.status_code] += 1
                        if r.status_code == 200 and "store" in r.json()["degraded"]:
                            codes["degraded"] += 1
                    except httpx.HTTPError:
                        codes["error"] += 1

        with ThreadPoolExecutor(4) as pool:
            for u in urls * 2:
                pool.submit(load, u)
            time.sleep(1.0)
            pg_server.stop("fast")
            time.sleep(4.0)
            pg_server.start()
            t_end = time.monotonic() + 60
            while not all(_found(u, "pg-1", new["pg-1"]) for u in urls):
                assert time.monotonic() < t_end, "the replicas did not recover"
                time.sleep(0.2)
            stop.set()
        assert codes["degraded"] > 0 and set(codes) == {200, "degraded"}, codes
        # writes are taken again by themselves once the replica's watcher sees the database
        # (about a second: bench-results/store_outage.md); searches above answered all along
        t_end = time.monotonic() + 30
        while (r := httpx.put(f"{urls[1]}/products/pg-after", json={"id": "pg-after", "title": "after restart parka"},
                              headers={"x-api-key": KEY}, timeout=60)).status_code == 503:
            assert time.monotonic() < t_end, r.text
            time.sleep(0.2)
        assert r.status_code == 200, r.text
        want = len(_store_ids_once_up(pg_url))
        for u in urls:
            wait_for(lambda u=u: (h := _json(u + "/health")) is not None and h["products"] == want, 60,
                     f"{u} to follow a write after the restart", every=0.2)
        res = httpx.post(urls[0] + "/search", json={"text": "after restart parka", "k": 5, "use_intent": False},
                         timeout=30).json()
        assert "pg-after" in [h["id"] for h in res["results"]], res
    finally:
        codes_out = [_stop(p) for p in (*procs, worker)]
        for log in sorted(tmp_path.glob("*.log")):
            print(f"--- {log.name}\n{log.read_text()[-3000:]}")
    # uvicorn re-raises SIGTERM after its graceful shutdown (plain `vitrine serve`): -15 is a clean stop
    assert all(c in (0, -signal.SIGTERM) for c in codes_out) and codes_out[2] == 0, codes_out
