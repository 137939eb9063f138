"""`vitrine bench scaleout`: API replicas on a shared PostgreSQL store, against the SQLite data dir.

1. Ingest: products/s of `Engine.upsert` (a catalogue subset with photos, warm feature cache so
   the store's share shows) into a SQLite data dir and into PostgreSQL.
2. API latency: text and photo searches, closed loop, against `vitrine serve` on the SQLite dir
   and against `vitrine serve --store postgresql://...` (same products, same load, one at a time).
3. Follow lag: writes through replica A at a paced rate; replica B's index is polled (`/health`
   products) until each write is in it: lag = that moment minus the write's answer.

Everything runs on this machine (a throwaway PostgreSQL from vitrine_bench/pgserver.py, the
servers and the load generator share the CPU), so latencies include that contention.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from vitrine_bench.common import Report, start_server, summary_ms

log = logging.getLogger(__name__)


def _catalog(source: Path, n: int, folder: Path) -> Path:
    """``n`` catalogue products with their photos copied beside the file (photo paths may not
    leave a catalogue's folder)."""
    import json

    from vitrine.bundled import read_styles
    from vitrine.ingest.fashion import demo_subset, to_record

    keep = set(demo_subset(source, n))
    (folder / "images").mkdir(parents=True, exist_ok=True)
    out = folder / "catalog.jsonl"
    with open(out, "w") as f:
        for r in read_styles(source):
            if r["id"] in keep:
                shutil.copy(source / "images" / f"{r['id']}.jpg", folder / "images" / f"{r['id']}.jpg")
                f.write(json.dumps(to_record(r, f"images/{r['id']}.jpg")) + "\n")
    return out


def _ingest_rate(settings: Any, encoder: Any, catalog: Path) -> dict[str, float]:
    from vitrine.ingest.catalog import ingest_file
    from vitrine.search.engine import Engine

    eng = Engine(settings, encoder)
    try:
        t0 = time.perf_counter()
        rep = ingest_file(eng, catalog, progress=False)
        took = time.perf_counter() - t0
    finally:
        eng.close()
    if not rep.upserted:
        raise RuntimeError(f"nothing ingested from {catalog}: {rep.failed[:3]}")
    return {"products": rep.upserted, "seconds": round(took, 2), "products_per_s": round(rep.upserted / took, 1)}


async def _closed_loop(url: str, concurrency: int, duration: float, make) -> tuple[list[float], int, float]:
    """Each of ``concurrency`` clients sends its next request when the last one answered."""
    import aiohttp

    lat: list[float] = []
    errors = 0
    stop = time.perf_counter() + duration
    async with aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=concurrency),
                                     timeout=aiohttp.ClientTimeout(total=60)) as session:
        async def client(wid: int) -> None:
            nonlocal errors
            i = wid
            while time.perf_counter() < stop:
                method, path, kw = make(i)
                i += concurrency
                t0 = time.perf_counter()
                try:
                    async with session.request(method, path, **kw) as r:
                        await r.read()
                        ok = r.status == 200
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    ok = False
                if ok:
                    lat.append(time.perf_counter() - t0)
                else:
                    errors += 1

        t_start = time.perf_counter()
        await asyncio.gather(*(client(w) for w in range(concurrency)))
        return lat, errors, time.perf_counter() - t_start


def _api_latency(url: str, texts: list[str], photos: list[bytes], concurrency: int, duration: float) -> dict:
    import base64

    b64 = [base64.b64encode(p).decode() for p in photos]
    out = {}
    for mix in ("text", "photo"):
        def make(i: int, mix: str = mix) -> tuple[str, str, dict]:
            body = {"text": texts[i % len(texts)], "k": 10} if mix == "text" else {"image_b64": b64[i % len(b64)], "k": 10}
            return "POST", "/search", {"json": body}

        lat, errors, elapsed = asyncio.run(_closed_loop(url, concurrency, duration, make))
        out[mix] = {**summary_ms(lat), "errors": errors, "qps": round(len(lat) / elapsed, 1)}
    return out


def _follow_lag(a: str, b: str, key: str, rate: float, seconds: float) -> dict[str, Any]:
    """Paced text-only PUTs through ``a``; ``b``'s /health polled every 20 ms."""
    base = httpx.get(b + "/health", timeout=30).json()["products"]
    answered: list[float] = []
    seen: list[tuple[float, int]] = []
    stop = threading.Event()

    def poll() -> None:
        with httpx.Client(timeout=30) as c:
            while not stop.is_set():
                try:
                    seen.append((time.perf_counter(), c.get(b + "/health").json()["products"]))
                except (httpx.HTTPError, ValueError, KeyError):
                    pass
                time.sleep(0.02)

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    n_total = int(rate * seconds)
    errors = 0
    lock = threading.Lock()
    local = threading.local()

    def write(j: int) -> None:  # open loop: write j is due at j / rate, whoever is free sends it
        nonlocal errors
        c = getattr(local, "client", None)
        if c is None:
            c = local.client = httpx.Client(timeout=30, headers={"x-api-key": key})
        delay = t0 + j / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        pid = f"scaleout-{os.getpid()}-{j}"
        try:
            ok = c.put(f"{a}/products/{pid}", json={"id": pid, "title": f"scaleout lag probe {j} linen shirt"}
                       ).status_code == 200
        except httpx.HTTPError:
            ok = False
        with lock:
            if ok:
                answered.append(time.perf_counter())
            else:
                errors += 1

    from concurrent.futures import ThreadPoolExecutor

    t0 = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(write, range(n_total)))
    answered.sort()
    achieved = len(answered) / (time.perf_counter() - t0)
    t_end = time.perf_counter() + 30
    while time.perf_counter() < t_end and (not seen or seen[-1][1] < base + len(answered)):
        time.sleep(0.05)
    stop.set()
    t.join()
    ts = np.array([s[0] for s in seen])
    counts = np.array([s[1] for s in seen])
    lags = []
    for i, at in enumerate(answered):
        idx = np.nonzero((counts >= base + i + 1) & (ts >= at))[0]
        lags.append(float(ts[idx[0]] - at) if len(idx) else float("nan"))
    ok = [x for x in lags if x == x]
    return {"writes": len(answered), "errors": errors, "target_rate": rate, "achieved_rate": round(achieved, 1),
            "missing": len(lags) - len(ok), **summary_ms(ok), "lags_s": ok}


def run(out: Path, *, n: int = 400, rate: float = 50.0, write_s: float = 20.0, load_s: float = 15.0,
        concurrency: int = 4) -> Path:
    from vitrine.bundled import bundled_dir
    from vitrine.search.engine import build_encoder
    from vitrine.settings import Settings
    from vitrine_bench.api import query_pool
    from vitrine_bench.pgserver import PostgresServer

    source = bundled_dir()
    rep = Report("scaleout", out, "Scale-out: API replicas on a shared PostgreSQL store vs one SQLite data dir")
    work = Path(tempfile.mkdtemp(prefix="vitrine-scaleout-"))
    key = "scaleout-key"
    env = {"VITRINE_API_KEY": key, "VITRINE_INTENT": "false", "VITRINE_SNAPSHOT_INTERVAL_S": "30"}
    servers = []
    try:
        with PostgresServer() as pg:
            url = pg.create_db("scaleout")
            catalog = _catalog(source, n, work)
            settings = Settings(data_dir=work / "warm", intent=False, _env_file=None)
            encoder = build_encoder(settings)
            _ingest_rate(settings, encoder, catalog)  # warms the feature cache: both runs below reuse it
            ingest = {"sqlite": _ingest_rate(settings.updated(**{"data_dir": work / "sqlite"}), encoder, catalog),
                      "postgresql": _ingest_rate(settings.updated(**{"data_dir": work / "pg-ingest",
                                                                              "store": url}), encoder, catalog)}
            del encoder
            rep.add("ingest", ingest)
            texts, photos = query_pool(source, 200)
            api: dict[str, Any] = {}
            for name, data_dir, extra in (("sqlite", work / "sqlite", {}),
                                          ("postgresql", work / "replica-a", {"VITRINE_STORE": url})):
                srv = start_server(data_dir, {**env, **extra})
                servers.append(srv)
                api[name] = _api_latency(srv.url, texts, photos, concurrency, load_s)
                if name == "sqlite":
                    srv.stop()
                    servers.remove(srv)
            rep.add("api", api)
            b = start_server(work / "replica-b", {**env, "VITRINE_STORE": url})
            servers.append(b)
            lag = _follow_lag(servers[0].url, b.url, key, rate, write_s)
            rep.add("follow_lag", {k: v for k, v in lag.items() if k != "lags_s"})
            rep.add("follow_lags_s", lag["lags_s"])
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(work, ignore_errors=True)
    rep.text(f"`vitrine bench scaleout --n {n} --rate {rate:g} --seconds {write_s:g}`: {n} catalogue products "
             "with photos; one throwaway PostgreSQL 16 on this machine (fsync off: a test server); the servers, "
             "the database and the load generator share this machine's CPU (2 cores, shared with other jobs "
             "during the run: noisy, compare rows, not absolute numbers).")
    rep.table([{"store": k, **v} for k, v in ingest.items()], ["store", "products", "seconds", "products_per_s"],
              "Ingest (Engine.upsert, warm feature cache)")
    rows = [{"store": s, "query": m, "p50 ms": v["p50_ms"], "p99 ms": v["p99_ms"], "qps": v["qps"],
             "errors": v["errors"]} for s, mm in api.items() for m, v in mm.items()]
    rep.table(rows, ["store", "query", "p50 ms", "p99 ms", "qps", "errors"],
              f"API search latency ({concurrency} closed-loop clients, {load_s:g} s per row)")
    lg = rep.data["follow_lag"]
    rep.table([{"writes": lg["writes"], "achieved writes/s": lg["achieved_rate"], "p50 ms": lg["p50_ms"],
                "p99 ms": lg["p99_ms"], "missing": lg["missing"], "errors": lg["errors"]}],
              ["writes", "achieved writes/s", "p50 ms", "p99 ms", "missing", "errors"],
              "Follow lag: a write through replica A until replica B's index holds it (B follows every 0.5 s)")

    def draw(ax: Any) -> None:
        xs = np.sort(np.array(lag["lags_s"]) * 1000)
        ax.plot(xs, np.arange(1, len(xs) + 1) / max(1, len(xs)))
        ax.set_xlabel("follow lag (ms)")
        ax.set_ylabel("share of writes")
        ax.set_title(f"Replica B sees replica A's writes ({lg['achieved_rate']} writes/s)")
        ax.grid(alpha=0.3)

    rep.plot("scaleout.png", draw)
    return rep.write()
