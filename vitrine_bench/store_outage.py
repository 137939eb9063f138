"""A replica over PostgreSQL while the database is crashed (``pg_ctl -m immediate``) and back.

A real PostgreSQL (vitrine_bench/pgserver.py), one `vitrine serve --store URL` replica on the tiny
test towers (the store path is under test, not the models) holding ``n`` text products written
through its API. Paced load throughout: searches and product reads (``rate`` per second each) and
a write every ``write_every_s``, each recorded with its status, latency and whether it said
``degraded: ["store"]``. For each outage length the database is crashed, kept down, started
again; reported per phase (before / down / after): status counts and p50/p99 latency of each
kind, the longest a write waited to be refused, how long after the database's return the first
write was accepted, and whether every write acknowledged (200) is in the store at the end.

The test database commits synchronously (as a production one does): an acknowledged write is
durable, so a lost one would be Vitrine's fault, not the benchmark server's fast settings.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import psycopg

from vitrine_bench.common import Report, free_port, summary_ms
from vitrine_bench.encoders import matmul_flops
from vitrine_bench.pgserver import PostgresServer

KEY = "outage-bench-key"


class Load:
    """Paced searches, product reads and writes against one replica, each outcome recorded."""

    def __init__(self, base: str, rate: float, write_every_s: float, n: int) -> None:
        self.base, self.rate, self.write_every_s, self.n = base, rate, write_every_s, n
        self.phase = "before"
        self.rows: list[dict[str, Any]] = []
        self.acked: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def _record(self, kind: str, phase: str, t0: float, code: int | str, degraded: bool) -> None:
        with self._lock:
            self.rows.append({"kind": kind, "phase": phase, "t": t0, "s": time.monotonic() - t0,
                              "code": code, "degraded": degraded})

    def _loop(self, kind: str, every: float) -> None:
        i = 0
        with httpx.Client(timeout=30) as c:
            nxt = time.monotonic()
            while not self._stop.is_set():
                t0, phase = time.monotonic(), self.phase  # the phase the request was sent in
                degraded = False
                try:
                    if kind == "search":
                        r = c.post(f"{self.base}/search", json={"text": f"blue cotton shirt {i % 50}", "k": 10})
                        degraded = r.status_code == 200 and "store" in r.json().get("degraded", [])
                    elif kind == "product":
                        r = c.get(f"{self.base}/products/p{i % self.n}")
                        degraded = r.headers.get("x-vitrine-degraded") == "store"
                    else:
                        pid = f"w{int(time.time() * 1000)}-{i}"
                        r = c.put(f"{self.base}/products/{pid}", json={"id": pid, "title": f"red wool hat {i}"},
                                  headers={"x-api-key": KEY})
                        if r.status_code == 200:
                            self.acked.append(pid)
                    code: int | str = r.status_code
                except httpx.HTTPError as e:
                    code = type(e).__name__
                self._record(kind, phase, t0, code, degraded)
                i += 1
                nxt += every
                self._stop.wait(max(0.0, nxt - time.monotonic()))

    def start(self) -> None:
        for kind, every in (("search", 1 / self.rate), ("product", 1 / self.rate), ("write", self.write_every_s)):
            t = threading.Thread(target=self._loop, args=(kind, every), daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)


def _phase_rows(rows: list[dict[str, Any]], outage: float) -> list[dict[str, Any]]:
    out = []
    for phase in ("before", "down", "after"):
        for kind in ("search", "product", "write"):
            sel = [r for r in rows if r["phase"] == phase and r["kind"] == kind]
            if not sel:
                continue
            codes = Counter(str(r["code"]) for r in sel)
            s = summary_ms([r["s"] for r in sel])
            out.append({"outage_s": outage, "phase": phase, "kind": kind, "requests": len(sel),
                        "codes": " ".join(f"{k}:{v}" for k, v in sorted(codes.items())),
                        "degraded": sum(r["degraded"] for r in sel), "p50_ms": round(s["p50_ms"], 1),
                        "p99_ms": round(s["p99_ms"], 1), "max_ms": round(max(r["s"] for r in sel) * 1000, 1)})
    return out


def run(out: Path, *, outages: list[float], n: int = 200, rate: float = 20.0, write_every_s: float = 0.25,
        settle_s: float = 5.0) -> Path:
    rep = Report("store_outage", out, "A replica while its PostgreSQL store is crashed and back")
    rep.add("gflops_per_core_before", round(matmul_flops(1) / 1e9, 1))
    pg = PostgresServer().start()
    url = pg.create_db("outage")
    with psycopg.connect(url, autocommit=True) as c:
        c.execute('ALTER DATABASE "outage" SET synchronous_commit TO on')
    work = Path(pg.root) / "replica"
    env = {**os.environ, "VITRINE_MODEL": "tiny-vit-test", "VITRINE_ADAPTER": "none", "VITRINE_STORE": url,
           "VITRINE_INTENT": "false", "VITRINE_API_KEY": KEY, "VITRINE_CACHE_DIR": str(work / "cache"),
           "VITRINE_TORCH_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    port = free_port()
    log_path = work / "serve.log"
    work.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as logf:
        proc = subprocess.Popen([sys.executable, "-m", "vitrine.cli.__main__", "serve", "--data", str(work / "data"),
                                 "--port", str(port)], env=env, stdout=logf, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/v1"
    rows: list[dict[str, Any]] = []
    resumed: dict[float, float | None] = {}
    lost: dict[float, int] = {}
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(base.replace("/v1", "/health"), timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"the replica did not start: {log_path.read_text()[-2000:]}")
            time.sleep(0.5)
        colours = ("blue", "red", "black", "green", "white")
        for i in range(n):
            r = httpx.put(f"{base}/products/p{i}", json={"id": f"p{i}", "title": f"{colours[i % 5]} cotton shirt {i}",
                                                         "price": float(i)}, headers={"x-api-key": KEY}, timeout=60)
            r.raise_for_status()
        time.sleep(settle_s)
        for outage in outages:
            load = Load(base, rate, write_every_s, n)
            load.start()
            time.sleep(settle_s)
            load.phase = "down"
            pg.stop("immediate")
            time.sleep(outage)
            pg.start()
            back = time.monotonic()
            load.phase = "after"
            time.sleep(max(settle_s, 6.0))
            load.stop()
            ok_after = [r for r in load.rows if r["kind"] == "write" and r["phase"] == "after" and r["code"] == 200]
            resumed[outage] = round(min(r["t"] for r in ok_after) - back, 2) if ok_after else None
            with psycopg.connect(url, autocommit=True) as c:
                stored = {r[0] for r in c.execute("SELECT id FROM vitrine_products WHERE NOT deleted")}
            lost[outage] = len([p for p in load.acked if p not in stored])
            rows += _phase_rows(load.rows, outage)
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        pg.cleanup()
    rep.add("gflops_per_core_after", round(matmul_flops(1) / 1e9, 1))
    rep.data.update({"rows": rows, "writes_resumed_after_s": resumed, "acknowledged_writes_lost": lost,
                     "products": n, "rate_per_s": rate, "write_every_s": write_every_s})
    rep.text(
        f"One `vitrine serve --store postgresql://...` replica (tiny test towers; the store path is under test), "
        f"{n} products. Paced load: {rate:g} searches/s and {rate:g} product reads/s, a write every "
        f"{write_every_s:g} s. The database is crashed with `pg_ctl -m immediate`, kept down, started again. "
        "Command: `vitrine bench store-outage --outages " + ",".join(f"{o:g}" for o in outages) + "`. "
        f"Machine: {rep.data['gflops_per_core_before']} / {rep.data['gflops_per_core_after']} GFLOP/s per core "
        "(fp32 matmul, before / after).")
    rep.table([{"outage_s": o, "writes_resumed_after_s": resumed[o], "acknowledged_writes_lost": lost[o]}
               for o in outages], ["outage_s", "writes_resumed_after_s", "acknowledged_writes_lost"],
              "Writes: first accepted write after the database returned; acknowledged writes missing from the store")
    rep.table(rows, ["outage_s", "phase", "kind", "requests", "codes", "degraded", "p50_ms", "p99_ms", "max_ms"],
              "Every request by phase: status counts, how many said degraded, latency")
    return rep.write()
