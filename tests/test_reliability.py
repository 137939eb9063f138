"""Reliability: versioned snapshots and crash recovery (SIGKILL trials), checksums, hot swap
under concurrent requests, degraded mode, and searches during writes (real models, real data)."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
import random
import shutil
import signal
import sqlite3
import sys
import threading
import time
import traceback
from pathlib import Path

import numpy as np
import pytest

from conftest import SOURCE, copy_sqlite, settings_maker, subset_engine_of
from kafka_broker import child_runtime, wait_exit
from vitrine.errors import ModelError, SwapRefused
from vitrine.search import fusion
from vitrine.search.engine import Engine
from vitrine.search.writes import ProductInput
from vitrine.search.models import Product, SearchRequest


def photo(pid: str) -> bytes:
    return (SOURCE / "images" / f"{pid}.jpg").read_bytes()


def clone(engine: Engine, dst: Path) -> Path:
    """A copy of an open engine's data dir (SQLite's online backup, photos, snapshots)."""
    dst.mkdir(parents=True)
    copy_sqlite(engine.data_dir / "records.sqlite", dst / "records.sqlite")
    shutil.copytree(engine.data_dir / "images", dst / "images")
    shutil.copytree(engine.data_dir / "index", dst / "index", ignore=shutil.ignore_patterns(".lock"))
    return dst


# This module checks durability and atomicity by a photo's self-match (score 1.0 against its own
# product's vectors): true of the MLP aligner, which embeds a photo alone, not of the default MoE gate,
# which routes a product's photo together with its title. So its engines use the shipped MLP.
@pytest.fixture(scope="module")
def settings_factory(cache_dir):
    return settings_maker(cache_dir, adapter="mlp")


@pytest.fixture(scope="module")
def encoder(settings_factory, tmp_path_factory):
    from vitrine.search.engine import build_encoder

    return build_encoder(settings_factory(tmp_path_factory.mktemp("unused")))


@pytest.fixture(scope="module")
def engine(settings_factory, encoder, catalog_dir, tmp_path_factory):
    eng = subset_engine_of(settings_factory(tmp_path_factory.mktemp("data")), encoder, catalog_dir)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def base_dir(engine, tmp_path_factory) -> Path:
    """The 240-product subset as a data dir of its own (copied from the session engine's)."""
    engine.save()
    return clone(engine, tmp_path_factory.mktemp("base") / "data")


@pytest.fixture()
def subset_engine(base_dir, settings_factory, encoder, tmp_path):
    d = shutil.copytree(base_dir, tmp_path / "data")
    eng = Engine(settings_factory(d, intent=False), encoder)
    yield eng
    eng.records.close()


def product(row: dict, pid: str, version: int | None = None) -> Product:
    return Product(id=pid, title=row["productDisplayName"], category=[row["masterCategory"], row["articleType"]],
                   attributes={"gender": row["gender"], "colour": row["baseColour"]}, version=version)


# -- versioned snapshots, checksums, recovery -------------------------------------------------------------
def test_snapshots_are_versioned_verified_and_pruned(subset_engine, subset_rows):
    eng = subset_engine
    assert eng.recovery["snapshot"] and eng.recovery["replayed"] == 0 and not eng.recovery["rebuilt"]
    for i in range(5):  # five more versions, each after a change
        eng.upsert([ProductInput(product(subset_rows[i], f"v{i}"), image=photo(subset_rows[i]["id"]))])
        assert eng.save() and not eng.save()  # nothing changed: no new version
    versions = eng.snapshots.versions()
    assert len(versions) == eng.settings.storage.snapshot_keep == 3
    assert [v.version for v in versions] == sorted((v.version for v in versions), reverse=True)
    newest = versions[0]
    assert eng.snapshot_version == newest.name
    m = newest.manifest
    assert m["seq"] == eng.records.seq and m["count"] == len(eng) == 245
    assert m["records"]["store_id"] == eng.store_id and m["model_key"] == eng.model_key
    for name, sha in m["files"].items():  # every file carries its SHA-256
        assert hashlib.sha256((newest.path / name).read_bytes()).hexdigest() == sha
    assert m["artifacts"]["files"]["adapter.weights"]["sha256"] == m["artifacts"]["files"]["adapter.weights"]["pinned"]
    pointer = json.loads((eng.data_dir / "index" / "manifest.json").read_text())
    assert pointer["dir"] == f"snapshots/{newest.name}" and pointer["files"] == m["files"]


def test_a_damaged_version_is_refused_and_the_previous_one_serves(subset_engine, settings_factory, encoder,
                                                                  subset_rows):
    from fastapi.testclient import TestClient

    from vitrine.web.app import create_app

    eng = subset_engine
    eng.upsert([ProductInput(product(subset_rows[0], "late-1"), image=photo(subset_rows[0]["id"]))])
    eng.save()
    good = eng.snapshot_version
    eng.upsert([ProductInput(product(subset_rows[1], "late-2"), image=photo(subset_rows[1]["id"]))])
    eng.delete([eng.records.ids()[0]])
    eng.save()
    bad = eng.snapshots.versions()[0]
    q = SearchRequest(text="blue shirt", k=10, use_intent=False)
    before = [h.id for h in eng.search(q).results]
    n, facets = len(eng), eng.facets()
    eng.records.close()
    raw = bytearray((bad.path / "fused.vidx").read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # one flipped byte
    (bad.path / "fused.vidx").write_bytes(bytes(raw))
    # a half-written version left by a crash is ignored (and swept by the next publish)
    partial = eng.snapshots.snapshots_dir / ".tmp-v00000099-12345"
    partial.mkdir()
    (partial / "fused.vidx").write_bytes(b"half")
    e2 = Engine(settings_factory(eng.data_dir, intent=False), encoder)
    try:
        rec = e2.recovery
        assert rec["snapshot"] == good and e2.snapshot_version == good
        assert rec["refused"] == [{"version": bad.name, "reason": f"vector index {bad.path / 'fused.vidx'} "
                                                                  "failed its checksum"}]
        assert rec["partial"] == [partial.name] and rec["replayed"] == 2  # the later upsert and delete
        assert len(e2) == n and [h.id for h in e2.search(q).results] == before
        # the filters came with the good version and took the two later changes
        assert not rec["filters_rebuilt"] and e2.facets() == facets
        assert "refused " + bad.name in rec["summary"]
        with TestClient(create_app(engine=e2)) as c:
            h = c.get("/health").json()
            assert h["recovery"]["refused"][0]["version"] == bad.name and h["snapshot"] == good
            assert 'vitrine_recovery{what="refused_snapshots"} 1.0' in c.get("/metrics").text
        assert e2.save() and not partial.exists()
    finally:
        e2.records.close()


def test_every_version_unusable_rebuilds_from_the_records(subset_engine, settings_factory, encoder):
    eng = subset_engine
    n, q = len(eng), SearchRequest(text="black watch", k=5, use_intent=False)
    before = [h.id for h in eng.search(q).results]
    eng.records.close()
    for v in eng.snapshots.versions():
        (v.path / "manifest.json").write_text("{truncated")
    e2 = Engine(settings_factory(eng.data_dir, intent=False), encoder)
    try:
        assert e2.recovery["rebuilt"] and e2.recovery["snapshot"] is None and e2.recovery["filters_rebuilt"]
        assert "manifest unreadable" in e2.recovery["refused"][0]["reason"]
        assert len(e2) == n and [h.id for h in e2.search(q).results] == before
    finally:
        e2.records.close()


def test_a_snapshot_ahead_of_the_records_is_refused(subset_engine, settings_factory, encoder, subset_rows, tmp_path):
    """Records restored from an older copy: the snapshot claims changes the store lacks."""
    eng = subset_engine
    old = tmp_path / "old.sqlite"
    with eng.records._lock, sqlite3.connect(old) as out:
        eng.records._conn.backup(out)
    eng.upsert([ProductInput(product(subset_rows[3], "newer"), image=photo(subset_rows[3]["id"]))])
    eng.close()  # every connection to the data dir's files (records, rules) closed before the restore
    for suffix in ("-wal", "-shm"):
        (eng.data_dir / f"records.sqlite{suffix}").unlink(missing_ok=True)
    shutil.copy(old, eng.data_dir / "records.sqlite")
    e2 = Engine(settings_factory(eng.data_dir, intent=False), encoder)
    try:
        assert "ahead of" in json.dumps(e2.recovery["refused"]) or "replaced by an older copy" in \
            json.dumps(e2.recovery["refused"])
        assert len(e2) == 240 and "newer" not in set(e2.records.ids())
    finally:
        e2.records.close()


# -- crash trials: SIGKILL at random points during snapshot writes ----------------------------------------
N_CRASH_PRODUCTS = 30


def _snapshotting_child(settings, encoder, log_path: Path, rows: list[dict], seed: int,
                        save_every: int) -> int:
    """Forked: upsert/delete products and publish a snapshot after every ``save_every`` changes,
    forever; every change is logged (fsynced) as pending before it starts and done once it returned."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        child_runtime(encoder)
        eng = Engine(settings, encoder)
        rng = random.Random(seed)
        state = {r.id: (r.version or 0) for r in eng.records.iter_rows(with_vectors=False) if r.id.startswith("c")}
        done = 0
        with open(log_path, "a") as log:
            def note(entry: dict) -> None:
                log.write(json.dumps(entry) + "\n")
                log.flush()
                os.fsync(log.fileno())

            while True:
                pid_ = f"c{rng.randrange(N_CRASH_PRODUCTS)}"
                if pid_ in state and rng.random() < 0.2:
                    entry = {"op": "delete", "id": pid_}
                    note({**entry, "state": "pending"})
                    eng.delete([pid_])
                    state.pop(pid_)
                else:
                    v = max(state.get(pid_, 0), _last_version(log_path, pid_)) + 1
                    row = rows[rng.randrange(len(rows))]
                    entry = {"op": "upsert", "id": pid_, "version": v, "row": row["id"]}
                    note({**entry, "state": "pending"})
                    rep = eng.upsert([ProductInput(product(row, pid_, v), image=photo(row["id"]))])
                    assert rep.upserted == 1, rep
                    state[pid_] = v
                note({**entry, "state": "done"})
                done += 1
                if done % save_every == 0:
                    eng.save()
    except BaseException:  # noqa: BLE001 - a child process: its traceback goes to the parent's log
        traceback.print_exc()
    finally:
        os._exit(code)


def _last_version(log_path: Path, pid: str) -> int:
    v = 0
    try:
        for line in log_path.read_text().splitlines():
            e = json.loads(line)
            if e["id"] == pid and e["op"] == "upsert":
                v = max(v, e["version"])
    except (OSError, ValueError):
        pass
    return v


def _expected(log_path: Path) -> tuple[dict[str, dict], dict | None]:
    """Live products after every change that returned, and the one in flight at the kill (if any)."""
    live: dict[str, dict] = {}
    pending = None
    for line in log_path.read_text().splitlines():
        e = json.loads(line)
        if e["state"] == "pending":
            pending = e
            continue
        pending = None
        if e["op"] == "delete":
            live.pop(e["id"], None)
        else:
            live[e["id"]] = e
    return live, pending


def _check_nothing_lost(eng: Engine, live: dict[str, dict], pending: dict | None, rows: dict[str, dict]) -> None:
    ours = {r.id: r for r in eng.records.iter_rows(with_vectors=True) if r.id.startswith("c")}
    expect = dict(live)
    if pending is not None:  # the change in flight at the kill may or may not have committed
        pid = pending["id"]
        committed = (pid not in ours) if pending["op"] == "delete" else \
            (pid in ours and ours[pid].version == pending["version"])
        if committed:
            if pending["op"] == "delete":
                expect.pop(pid, None)
            else:
                expect[pid] = pending
    assert set(ours) == set(expect), (sorted(ours), sorted(expect))
    assert len(eng) == eng.records.count() and set(eng.vectors["fused"].ids().tolist()) == \
        {r.iid for r in eng.records.iter_rows(with_vectors=False)}
    for pid, e in expect.items():
        out = eng.get(pid)
        assert out.version == e["version"]  # the latest version
        assert out.title == " ".join(rows[e["row"]]["productDisplayName"].split())
        rec = ours[pid]
        assert np.allclose(eng.vector_of(pid), rec.vectors["fused"], atol=1e-6)  # the index holds that version
        assert np.allclose(eng.vector_of(pid, "image"), rec.vectors["image"], atol=1e-6)
    for pid, e in list(expect.items())[:6]:  # searchable through the public read path
        res = eng.search(SearchRequest(k=40, use_intent=False), image=photo(e["row"]))
        assert pid in {h.id for h in res.results if h.score > 0.999}


@pytest.mark.slow
def test_sigkill_during_snapshot_writes_loses_nothing(base_dir, settings_factory, encoder, subset_rows, tmp_path):
    """20 trials: a process upserting, deleting and publishing a snapshot after every change is
    SIGKILLed at a random moment inside a snapshot write; a restart must find every product at
    its latest version, indexed and searchable."""
    rows = subset_rows[:60]
    by_id = {r["id"]: r for r in subset_rows}
    summary = []
    for trial in range(20):
        rng = random.Random(7000 + trial)
        d = shutil.copytree(base_dir, tmp_path / f"t{trial}")
        s = settings_factory(d, intent=False, snapshot_keep=rng.choice([1, 2, 3]))
        log_path = tmp_path / f"t{trial}.log"
        log_path.touch()
        pid = _snapshotting_child(s, encoder, log_path, rows, seed=trial, save_every=rng.choice([1, 1, 2, 3]))
        try:
            # let it work a while, then strike at a random point of a snapshot being written
            target = rng.randrange(3, 25)
            t_end = time.monotonic() + 60
            while sum(1 for _ in open(log_path)) < 2 * target and time.monotonic() < t_end:
                time.sleep(0.005)
            snaps = d / "index" / "snapshots"
            while not any(n.startswith(".tmp-") for n in os.listdir(snaps)) and time.monotonic() < t_end:
                time.sleep(0.0002)
            time.sleep(rng.random() * 0.03)
        finally:
            os.kill(pid, signal.SIGKILL)
        assert wait_exit(pid, timeout=10) == -signal.SIGKILL
        mid_write = [n for n in os.listdir(d / "index" / "snapshots") if n.startswith(".tmp-")]
        live, pending = _expected(log_path)
        eng = Engine(s, encoder)  # the restart
        try:
            _check_nothing_lost(eng, live, pending, by_id)
            rec = eng.recovery
            assert rec["partial"] == sorted(mid_write) and not rec["refused"]
            summary.append((trial, bool(mid_write), rec["snapshot"], rec["replayed"], len(live),
                            sum(1 for _ in open(log_path)) // 2))
        finally:
            eng.records.close()
    print("crash trials (trial, killed mid-write, snapshot loaded, changes replayed, live products, changes made):")
    for row in summary:
        print("  ", row)
    assert len(summary) == 20
    assert sum(1 for r in summary if r[1]) >= 10  # most kills landed inside a snapshot write


# -- checksums of model artifacts -----------------------------------------------------------------------
def _copy_adapter(name: str, dst: Path) -> Path:
    from vitrine.encoders.adapters import WEIGHTS_DIR

    return Path(shutil.copytree(WEIGHTS_DIR / name, dst, ignore=shutil.ignore_patterns("*.jsonl")))


def test_adapter_weights_are_pinned_and_a_mismatch_is_refused(tmp_path):
    from vitrine.encoders.adapters import load_adapter

    folder = _copy_adapter("linear", tmp_path / "linear")
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["weights_sha256"] == hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()
    load_adapter(folder)
    raw = bytearray((folder / "model.safetensors").read_bytes())
    raw[-100] ^= 0x01
    (folder / "model.safetensors").write_bytes(bytes(raw))
    with pytest.raises(ModelError, match="checksum mismatch"):
        load_adapter(folder)
    # re-saving pins the new weights
    folder2 = _copy_adapter("linear", tmp_path / "linear2")
    a = load_adapter(folder2)
    a.save_pretrained(tmp_path / "resaved")
    assert json.loads((tmp_path / "resaved" / "config.json").read_text())["weights_sha256"] == \
        hashlib.sha256((tmp_path / "resaved" / "model.safetensors").read_bytes()).hexdigest()


# -- hot swap -------------------------------------------------------------------------------------------
def _broken_adapter(dst: Path) -> Path:
    """A well-formed adapter with the wrong weights (re-initialised): loads fine, aligns nothing."""
    import torch

    from vitrine.encoders.adapters import load_adapter

    a = load_adapter("mlp")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in a.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    a.save_pretrained(dst)
    return dst


@pytest.mark.slow
def test_hot_swap_under_load_is_atomic_and_a_failed_check_rolls_back(base_dir, settings_factory, encoder,
                                                                      subset_rows, tmp_path):
    from fastapi.testclient import TestClient
    from pydantic import SecretStr

    from vitrine.web.app import create_app

    d = shutil.copytree(base_dir, tmp_path / "data")
    s = settings_factory(d, intent=False, api_key=SecretStr("k3y"), snapshot_interval_s=0)
    eng = Engine(s, encoder)
    linear = _copy_adapter("linear", tmp_path / "linear")
    broken = _broken_adapter(tmp_path / "broken")
    key = {"X-API-Key": "k3y"}
    old_key = eng.model_key
    rows = subset_rows[:40]
    photos = {r["id"]: base64.b64encode(photo(r["id"])).decode() for r in rows}
    errors: list[str] = []
    seen: dict[int, list[str]] = {}
    stop = threading.Event()
    with TestClient(create_app(engine=eng)) as c:
        assert c.post("/admin/swap", json={"adapter": str(linear)}).status_code == 401  # admin needs the key

        def client(n: int) -> None:
            rng = random.Random(n)
            seen[n] = []
            while not stop.is_set():
                r = rows[rng.randrange(len(rows))]
                body = {"image_b64": photos[r["id"]], "k": 3} if rng.random() < 0.5 else \
                    {"text": r["productDisplayName"], "k": 3, "use_intent": False}
                resp = c.post("/search", json=body)
                if resp.status_code != 200:
                    errors.append(f"{resp.status_code} {resp.text[:200]}")
                    continue
                out = resp.json()
                seen[n].append(out["model"])
                if "image_b64" in body and out["results"][0]["score"] < 0.99:  # photo -> itself, in either model
                    errors.append(f"torn: photo query scored {out['results'][0]['score']} under {out['model']}")

        threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        r = c.post("/admin/swap", json={"adapter": str(linear)}, headers=key)
        assert r.status_code == 200, r.text
        rep = r.json()
        assert rep["accepted"] and rep["switched"] and rep["candidate"]["reembedded"] == 240
        assert {ch["name"] for ch in rep["checks"]} == {"complete", "finite", "overlap", "agreement", "recall"}
        new_key = rep["candidate"]["model_key"]
        assert new_key != old_key and eng.model_key == new_key
        time.sleep(1.0)
        # a broken model version: refused by the canary, the live (new) version keeps serving
        r = c.post("/admin/swap", json={"adapter": str(broken)}, headers=key)
        assert r.status_code == 409, r.text
        err = r.json()["error"]
        assert err["code"] == "swap_refused" and "recall" in err["message"] and "still serving" in err["message"]
        assert err["detail"]["accepted"] is False
        # an adapter whose weights fail their checksum: refused before anything loads
        tampered = _copy_adapter("linear", tmp_path / "tampered")
        raw = bytearray((tampered / "model.safetensors").read_bytes())
        raw[-10] ^= 0x01
        (tampered / "model.safetensors").write_bytes(bytes(raw))
        r = c.post("/admin/swap", json={"adapter": str(tampered)}, headers=key)
        assert r.status_code == 409 and "checksum mismatch" in r.json()["error"]["message"]
        time.sleep(0.5)
        stop.set()
        for t in threads:
            t.join()
        metrics = c.get("/metrics").text
        assert 'vitrine_swaps_total{result="switched"} 1.0' in metrics
        assert 'vitrine_swaps_total{result="refused"} 2.0' in metrics
        assert c.get("/health").json()["model"] == new_key
    eng.close()
    assert not errors, errors[:5]
    for models in seen.values():  # each client saw the old model, then only the new one
        assert models and set(models) <= {old_key, new_key}
        switch = models.index(new_key) if new_key in models else len(models)
        assert all(m == old_key for m in models[:switch]) and all(m == new_key for m in models[switch:])
    assert any(new_key in m and old_key in m for m in seen.values())
    # a restart serves the swapped-in model from its snapshot (no rebuild, nothing re-embedded)
    active = json.loads((d / "index" / "active_model.json").read_text())
    assert active["adapter"] == str(linear) and active["model_key"] == new_key
    e2 = Engine.open(settings_factory(d, intent=False))
    try:
        assert e2.model_key == new_key and not e2.recovery["rebuilt"] and e2.recovery["replayed"] == 0
        assert len(e2) == 240
    finally:
        e2.records.close()
    # the swapped-in adapter damaged: the configured model serves (its kept snapshot), and says why
    raw = bytearray((linear / "model.safetensors").read_bytes())
    raw[-10] ^= 0x01
    (linear / "model.safetensors").write_bytes(bytes(raw))
    e3 = Engine.open(settings_factory(d, intent=False))
    try:
        assert e3.model_key == old_key and len(e3) == 240
        assert "unusable" in e3.recovery["notes"][0] and "checksum mismatch" in e3.recovery["notes"][0]
    finally:
        e3.records.close()


def test_swap_to_another_index_and_back_to_a_stored_snapshot(subset_engine):
    from vitrine.search.swap import SwapRequest

    eng = subset_engine
    eng.save()
    first, default = eng.snapshot_version, eng.vectors["fused"].factory  # the settings' default (SQfp16)
    q = SearchRequest(text="red dress", k=10, use_intent=False)
    before = [h.id for h in eng.search(q).results]
    rep = eng.swap(SwapRequest(index_factory="HNSW32"))
    assert rep.switched and eng.settings.index.index_factory == "HNSW32" and eng.vectors["fused"].factory == "HNSW32"
    checks = {c.name: c for c in rep.checks}
    assert checks["agreement"].value == 1.0 and checks["overlap"].value >= 0.9
    assert eng.snapshot_version != first and eng.snapshots.versions()[0].manifest["factory"] == "HNSW32"
    rep = eng.swap(SwapRequest(snapshot=first))  # roll back to the stored version of the default index
    assert rep.switched and rep.candidate["source"] == f"snapshot {first}" and eng.vectors["fused"].factory == default
    assert [h.id for h in eng.search(q).results] == before
    with pytest.raises(SwapRefused, match="no snapshot 'v99999999'"):
        eng.swap(SwapRequest(snapshot="v99999999"))
    dry = eng.swap(SwapRequest(index_factory="HNSW32", dry_run=True))
    assert dry.accepted and not dry.switched and eng.vectors["fused"].factory == default


# -- degrade, don't fail --------------------------------------------------------------------------------------
@pytest.fixture()
def own_encoder_engine(base_dir, settings_factory, encoder, tmp_path):
    """An engine whose adapter is its own copy (the session encoder's towers), to break on purpose."""
    from vitrine.encoders.encoder import MultimodalEncoder

    enc = MultimodalEncoder(encoder.towers, copy.deepcopy(encoder.adapter), cache=encoder.cache)
    d = shutil.copytree(base_dir, tmp_path / "data")
    eng = Engine(settings_factory(d, intent=False), enc)
    yield eng
    eng.records.close()


def test_gate_failure_degrades_to_the_light_path_or_to_words(own_encoder_engine, subset_rows):
    from fastapi.testclient import TestClient

    from vitrine.web.app import create_app

    eng = own_encoder_engine
    adapter = eng.encoder.adapter
    working = adapter.forward

    def broken_router(*a, **kw):
        raise RuntimeError("router produced NaN weights")

    adapter.forward = broken_router
    row = subset_rows[7]
    with TestClient(create_app(engine=eng)) as c:
        # at the floor (an untuned catalogue) a text query ranks by the text tower's own cosine and
        # never runs the gate: its failure costs that query nothing
        r = c.post("/search", json={"text": f"{row['productDisplayName']} gate-0", "k": 5, "use_intent": False})
        assert r.status_code == 200 and r.json()["degraded"] == [] and r.json()["results"]
        eng.settings.search.calibration = "off"  # the configured fusion: the shared space ranks text
        # no light path: words alone (BM25 + graph), marked degraded
        r = c.post("/search", json={"text": f"{row['productDisplayName']} gate-1", "k": 5, "explain": True,
                                    "use_intent": False})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["degraded"] == ["gate"] and body["results"]
        assert "bm25" in body["results"][0]["explanation"]["signals"]
        # a photo alone has no lexical fallback: a clear 503, not a crash
        r = c.post("/search", json={"image_b64": base64.b64encode(photo(row["id"])).decode(), "k": 3})
        assert r.status_code == 503 and "photo-only" in r.json()["error"]["message"]
        # an adapter with a light path (same space, without the failing part) answers with vectors
        adapter.forward_light = working
        r = c.post("/search", json={"image_b64": base64.b64encode(photo(subset_rows[8]["id"])).decode(), "k": 3})
        assert r.status_code == 200 and r.json()["degraded"] == ["gate"]
        assert r.json()["results"][0]["score"] > 0.99  # the light path's vectors still find the photo itself
        # a gate that overstays its budget degrades the same way
        del adapter.forward_light

        def slow(*a, **kw):
            time.sleep(0.5)
            return working(*a, **kw)

        adapter.forward = slow
        eng.settings.search.gate_timeout_ms = 50
        r = c.post("/search", json={"text": "navy blue casual shirt gate-2", "k": 5, "use_intent": False})
        assert r.status_code == 200 and r.json()["degraded"] == ["gate"]
        m = c.get("/metrics").text
        assert 'vitrine_degraded_total{component="gate"} 3.0' in m


def test_fusion_failure_or_timeout_falls_back_to_plain_vectors(own_encoder_engine):
    eng = own_encoder_engine
    eng.settings.search.calibration = "off"  # the configured fusion weights (an untuned catalogue ranks at the floor)
    q = SearchRequest(text="women red handbag", k=5, explain=True, use_intent=False)
    fused = eng.search(q)
    assert fused.degraded == [] and any(k.startswith("graph:") or k == "bm25"
                                        for h in fused.results for k in h.explanation.signals)
    real_rank = fusion.rank

    def slow_rank(*a, **kw):  # a fusion that overstays its budget, deterministically
        time.sleep(0.3)
        return real_rank(*a, **kw)

    eng.settings.search.fusion_timeout_ms = 50
    fusion.rank = slow_rank
    try:
        res = eng.search(q)
    finally:
        fusion.rank = real_rank
    assert res.degraded == ["fusion"] and len(res.results) == 5
    plain = eng.rank_vectors(eng.query_vectors(q.text, None), 5, None)
    assert [h.id for h in res.results] == [eng.records.get_by_iids([i])[i].id for i, _, _ in plain]
    eng.settings.search.fusion_timeout_ms = 2000
    eng.graph.match_query = None  # the graph breaks: its retriever degrades alone
    res = eng.search(SearchRequest(text="women red handbag graph", k=5, use_intent=False))
    assert "graph" in res.degraded and len(res.results) == 5


# -- reads during writes ---------------------------------------------------------------------------------------
def test_searches_during_upserts_and_deletes_never_see_a_torn_state(subset_engine, encoder, subset_rows):
    """Writers move products between two photos and delete/re-add them while searches run: every
    hit's score must match the photo its record shows (a record and its vectors always agree),
    and no search, recommendation or comparison fails."""
    eng = subset_engine
    rows = subset_rows[:40]
    pv = {r["id"]: v for r, v in zip(rows, encoder.encode(images=[photo(r["id"]) for r in rows]).image)}
    key_of = {hashlib.sha256(photo(r["id"])).hexdigest(): r["id"] for r in rows}
    ids = [f"m{i}" for i in range(20)]
    eng.upsert([ProductInput(product(rows[i], pid), image=photo(rows[i]["id"])) for i, pid in enumerate(ids)])
    stable = [r for r in eng.records.ids() if not r.startswith("m")][:10]
    stop = threading.Event()
    errors: list[str] = []
    counts = {"searches": 0, "writes": 0}

    def writer() -> None:
        rng = random.Random(1)
        try:
            while not stop.is_set():
                i = rng.randrange(20)
                if rng.random() < 0.2:
                    counts["writes"] += eng.delete([ids[i]])
                else:
                    r = rows[i + 20 * rng.randrange(2)]
                    counts["writes"] += eng.upsert([ProductInput(product(r, ids[i]), image=photo(r["id"]))]).upserted
        except Exception:  # noqa: BLE001 - a worker thread: the test asserts its errors list is empty
            errors.append(traceback.format_exc())

    def reader(n: int) -> None:
        rng = random.Random(100 + n)
        try:
            while not stop.is_set():
                r = rows[rng.randrange(40)]
                res = eng.search(SearchRequest(k=5, use_intent=False), image=photo(r["id"]))
                q = pv[r["id"]]
                for h in res.results:
                    shown = key_of.get(h.image_url.rsplit("/", 1)[-1].split(".")[0]) if h.image_url else None
                    if shown is not None and abs(h.score - float(q @ pv[shown])) > 1e-3:
                        errors.append(f"torn: {h.id} scored {h.score:.4f} but shows {shown} "
                                      f"({float(q @ pv[shown]):.4f})")
                if len(res.results) != 5:
                    errors.append(f"{len(res.results)} results")
                eng.search(SearchRequest(text=r["productDisplayName"], k=5, use_intent=False))
                eng.recommend(stable[rng.randrange(len(stable))], "similar", 5)
                eng.compare(stable[:2])
                counts["searches"] += 1
        except Exception:  # noqa: BLE001 - a worker thread: the test asserts its errors list is empty
            errors.append(traceback.format_exc())

    threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    # run until enough of both interleaved (a count, not a time: a slow machine just takes longer)
    deadline = time.monotonic() + 180
    while (counts["writes"] <= 50 or counts["searches"] <= 50) and not errors and time.monotonic() < deadline:
        time.sleep(0.1)
    stop.set()
    for t in threads:
        t.join(30)
    assert not errors, errors[:3]
    assert counts["writes"] > 50 and counts["searches"] > 50, counts
    assert eng.index.lock.writes >= counts["writes"]  # each one an exclusive step
