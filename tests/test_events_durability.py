"""Shopper events survive a crash, and retention forgets them (vitrine/feedback/eventlog.py,
`vitrine events purge`): a real `vitrine serve` process takes a flood of POST /v1/events, is
killed with SIGKILL in the middle of it, restarts, and holds every event it answered 202 for."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest

from conftest import REPO

KEY = "events-crash-key"


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "VITRINE_MODEL": "tiny-vit-test", "VITRINE_ADAPTER": "none",
            "VITRINE_CACHE_DIR": str(tmp_path / "cache"), "VITRINE_TORCH_THREADS": "1", "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(REPO), "VITRINE_API_KEY": KEY,
            "VITRINE_TUNE_AFTER_INGEST": "false"}  # tuning is test_tuning's (20 s of this test)


def _serve(cli: list[str], data: Path, port: int, env: dict[str, str], log: Path) -> subprocess.Popen:
    out = open(log, "ab")  # the child keeps it
    proc = subprocess.Popen([*cli, "serve", "--data", str(data), "--port", str(port)], env=env, stdout=out,
                            stderr=subprocess.STDOUT)
    t_end = time.monotonic() + 300
    while True:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        assert time.monotonic() < t_end, "the server did not come up"
        time.sleep(0.3)


def _stored_ids(data: Path) -> set[str]:
    with sqlite3.connect(f"file:{data / 'events.sqlite'}?mode=ro", uri=True) as db:
        return {r[0] for r in db.execute("SELECT event_id FROM events")}


@pytest.mark.slow
def test_every_event_answered_202_survives_a_kill_9(catalog_dir, tmp_path):
    from vitrine_bench.common import free_port

    env = _env(tmp_path)
    data = tmp_path / "data"
    cli = [sys.executable, "-m", "vitrine.cli.__main__"]
    done = subprocess.run([*cli, "ingest", str(catalog_dir / "catalog.jsonl"), "--data", str(data), "--limit", "60"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    proc = _serve(cli, data, port, env, log)
    try:
        pages = []
        for text in ("shirt", "shoes", "watch", "bag", "blue", "black", "women", "men"):
            r = httpx.post(url + "/v1/search", json={"text": text, "k": 10}, timeout=30).json()
            if r["results"]:
                pages.append((r["query_id"], [h["id"] for h in r["results"]]))
        assert pages
        acked: list[str] = []
        tried = [0]
        lock = threading.Lock()
        stop = threading.Event()

        def flood() -> None:
            n = 0
            with httpx.Client(base_url=url, headers={"X-API-Key": KEY}, timeout=10) as http:
                while not stop.is_set():
                    qid, ids = pages[n % len(pages)]
                    batch = [{"type": "click", "query_id": qid, "product_id": ids[i % len(ids)],
                              "position": i % len(ids), "event_id": uuid.uuid4().hex} for i in range(50)]
                    n += 1
                    with lock:
                        tried[0] += len(batch)
                    try:
                        r = http.post("/v1/events", json={"events": batch})
                    except httpx.HTTPError:
                        continue  # the server died mid-call: unknown, not acknowledged
                    if r.status_code == 202:
                        assert r.json()["accepted"] == 50
                        with lock:
                            acked.extend(e["event_id"] for e in batch)

        threads = [threading.Thread(target=flood) for _ in range(4)]
        for t in threads:
            t.start()
        t_end = time.monotonic() + 60
        while len(acked) < 2000 and time.monotonic() < t_end:
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)  # in the middle of the flood
        proc.wait(30)
        time.sleep(0.5)
        stop.set()
        for t in threads:
            t.join(30)
        assert len(acked) >= 500, f"only {len(acked)} events acknowledged before the kill"
        answered = set(acked)
        # restart over the same data dir: it opens and serves, and every acknowledged event is there
        proc = _serve(cli, data, port, env, log)
        stored = _stored_ids(data)
        lost = answered - stored
        assert not lost, f"{len(lost)} of {len(answered)} events answered 202 are missing after kill -9"
        assert len(stored) <= tried[0]
        counted = subprocess.run([*cli, "events", "count", "--data", str(data), "--json"], env=env,
                                 capture_output=True, text=True, timeout=120)
        assert counted.returncode == 0 and f'"events": {len(stored)}' in counted.stdout, counted.stderr[-2000:]
        qid, ids = pages[0]
        r = httpx.post(url + "/v1/events", headers={"X-API-Key": KEY}, timeout=30,
                       json={"events": [{"type": "purchase", "query_id": qid, "product_id": ids[0], "position": 0}]})
        assert r.status_code == 202 and r.json()["new"] == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_purge_forgets_what_is_older_than_the_retention(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from vitrine.cli.app import main
    from vitrine.errors import InvalidInput
    from vitrine.feedback.types import EventRecord, SearchLog
    from vitrine.feedback.eventlog import EventLog
    from vitrine.feedback.intake import EventIn, Feedback
    from vitrine.settings import FeedbackSettings

    data = tmp_path / "data"
    now = time.time()
    day = 86400.0
    log = EventLog(data / "events.sqlite")
    for qid, age in (("old-search", 40), ("mid-search", 10), ("new-search", 0)):
        log.log_search(SearchLog(query_id=qid, ts=now - age * day, text=qid, norm=qid, ids=("p1", "p2")))
        log.add_events([EventRecord(event_id=f"{qid}-e", query_id=qid, type="click", product_id="p1", position=0,
                                    ts=now - age * day)])
    log.close()

    monkeypatch.setenv("VITRINE_EVENTS_RETENTION_DAYS", "30")  # the setting ...
    res = CliRunner().invoke(main, ["events", "purge", "--data", str(data)])
    assert res.exit_code == 0, res.output
    assert "searches 3 -> 2, events 3 -> 2" in res.output
    res = CliRunner().invoke(main, ["events", "purge", "--data", str(data), "--retention-days", "5"])  # ... or the flag
    assert res.exit_code == 0 and "searches 2 -> 1, events 2 -> 1" in res.output, res.output
    res = CliRunner().invoke(main, ["events", "count", "--data", str(data), "--json"])
    assert res.output.strip() == '{"searches": 1, "events": 1}'
    log = EventLog(data / "events.sqlite")
    try:
        kept = log.read()
        assert [s.query_id for s in kept.searches] == ["new-search"]
        assert [e.event_id for e in kept.events] == ["new-search-e"]
        # an event on a search that retention removed is refused, naming the field
        fb = Feedback(log, FeedbackSettings(events_retention_days=5))
        with pytest.raises(InvalidInput, match=r"events\[0\]\.query_id"):
            fb.record([EventIn(type="click", query_id="mid-search", product_id="p1", position=0)])
        assert fb.record([EventIn(type="view", query_id="new-search", product_id="p2", position=1)]) == (1, 1)
    finally:
        log.close()
