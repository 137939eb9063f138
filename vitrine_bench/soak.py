"""Soak: minutes of mixed load against ``vitrine serve`` — searches (words, photos), recommendations,
comparisons, upserts and deletes — watching for errors and for memory that keeps growing.

Clients (threads, httpx, loopback) send back-to-back requests drawn from a fixed mix. Every
``sample_s`` seconds the sampler records the server's RSS (``/proc``), the window's request count,
error count and latency percentiles. Writes touch a bounded set of ids (``soak-0`` ..
``soak-<n>``), so the catalogue's size stays put and RSS growth means a leak, not more data.

The verdict: zero errors, and RSS that stops growing: the least-squares slope of RSS over the
second half of the run, in MB per minute, and the growth from the middle to the end.
"""

from __future__ import annotations

import base64
import random
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from vitrine.client import Client
from vitrine_bench.common import Report, Server, pct, start_server

KEY = "soak-key"
MIX = {"search_text": 0.40, "search_photo": 0.15, "search_both": 0.05, "recommend": 0.12, "compare": 0.10,
       "product": 0.05, "upsert": 0.10, "delete": 0.03}


def _pool(source: Path, data_dir: Path, n: int, seed: int) -> dict[str, Any]:
    from vitrine.evals import attribute_queries as aq
    from vitrine.index.records import RecordStore
    from vitrine.bundled import read_styles
    from vitrine.ingest.fashion import to_record

    store = RecordStore(data_dir / "records.sqlite")  # the products the data dir serves
    try:
        have = set(store.ids())
    finally:
        store.close()
    rows = [r for r in read_styles(source) if r["id"] in have]
    if len(rows) < n:
        raise ValueError(f"{data_dir} holds {len(rows)} products of the bundled catalogue; the soak needs {n}")
    rng = random.Random(seed)
    pick = rng.sample(range(len(rows)), n)
    texts = [q["text"] for q in aq.eval_queries(rows, pick, n=n // 2, seed=seed)]
    texts += [rows[i]["productDisplayName"] for i in pick[: n // 2]]
    photos = [base64.b64encode((source / "images" / f"{rows[i]['id']}.jpg").read_bytes()).decode() for i in pick[:200]]
    records = []
    for i in pick[:300]:
        rec = to_record(rows[i], "")
        rec.pop("image", None)
        rec["image_b64"] = base64.b64encode((source / "images" / f"{rows[i]['id']}.jpg").read_bytes()).decode()
        records.append(rec)
    return {"texts": texts, "photos": photos, "ids": [rows[i]["id"] for i in pick], "records": records}


class Load:
    def __init__(self, url: str, pool: dict[str, Any], n_soak_ids: int, seed: int) -> None:
        self.url, self.pool, self.n_soak_ids = url, pool, n_soak_ids
        self.rng_seed = seed
        self.lock = threading.Lock()
        self.window: list[tuple[str, float, int]] = []  # (kind, seconds, status)
        self.totals: dict[str, dict[str, int]] = {k: {"ok": 0, "errors": 0} for k in MIX}
        self.error_samples: list[str] = []
        self.stop = threading.Event()
        self.versions: dict[str, int] = {}

    def request(self, client: httpx.Client, rng: random.Random) -> tuple[str, httpx.Response]:
        p = self.pool
        kind = rng.choices(list(MIX), weights=list(MIX.values()))[0]
        if kind == "search_text":
            return kind, client.post("/search", json={"text": rng.choice(p["texts"]), "k": 10})
        if kind == "search_photo":
            return kind, client.post("/search", json={"image_b64": rng.choice(p["photos"]), "k": 10})
        if kind == "search_both":
            return kind, client.post("/search", json={"image_b64": rng.choice(p["photos"]),
                                                      "text": rng.choice(p["texts"]), "k": 10})
        if kind == "recommend":
            kinds = ("similar", "complementary")
            return kind, client.get(f"/recommend/{rng.choice(p['ids'])}", params={"kind": rng.choice(kinds), "k": 10})
        if kind == "compare":
            return kind, client.post("/compare", json={"ids": rng.sample(p["ids"], rng.choice([2, 3]))})
        if kind == "product":
            return kind, client.get(f"/products/{rng.choice(p['ids'])}")
        pid = f"soak-{rng.randrange(self.n_soak_ids)}"
        if kind == "delete":
            r = client.delete(f"/products/{pid}", headers={"X-API-Key": KEY})
            return kind, r
        with self.lock:
            v = self.versions[pid] = self.versions.get(pid, 0) + 1
        rec = dict(rng.choice(p["records"]), id=pid, version=int(time.time() * 1000) * 100 + v % 100)
        return kind, client.put(f"/products/{pid}", json=rec, headers={"X-API-Key": KEY})

    def client_loop(self, n: int) -> None:
        rng = random.Random(self.rng_seed * 1000 + n)
        with httpx.Client(base_url=self.url, timeout=60) as client:
            while not self.stop.is_set():
                t0 = time.perf_counter()
                try:
                    kind, r = self.request(client, rng)
                    status = r.status_code
                    body = r.text[:200] if status >= 400 else ""
                except httpx.HTTPError as e:
                    kind, status, body = "transport", 0, str(e)
                dt = time.perf_counter() - t0
                ok = 200 <= status < 300 or (kind == "delete" and status == 404)  # deleting an absent id
                with self.lock:
                    self.window.append((kind, dt, status))
                    if kind in self.totals:
                        self.totals[kind]["ok" if ok else "errors"] += 1
                    if not ok:
                        self.totals.setdefault("transport", {"ok": 0, "errors": 0})
                        if kind == "transport":
                            self.totals["transport"]["errors"] += 1
                        if len(self.error_samples) < 20:
                            self.error_samples.append(f"{kind} -> {status}: {body}")

    def take_window(self) -> list[tuple[str, float, int]]:
        with self.lock:
            w, self.window = self.window, []
        return w


def run(data_dir: Path, out: Path, *, source: Path, duration: float = 600.0, clients: int = 6,
        sample_s: float = 5.0, n_soak_ids: int = 200, seed: int = 0, server: Server | None = None) -> Path:
    pool = _pool(source, data_dir, 400, seed)
    own = server is None
    srv = server or start_server(data_dir, env={"VITRINE_API_KEY": KEY, "VITRINE_SNAPSHOT_INTERVAL_S": "30"})
    rep = Report("soak", out, f"Soak: {duration / 60:g} minutes of mixed load")
    samples: list[dict[str, Any]] = []
    load = Load(srv.url, pool, n_soak_ids, seed)
    try:
        with Client(srv.url, timeout=30) as vc:
            health0 = vc.health()
        rep.add("server_start", {k: health0.get(k) for k in ("products", "model", "index", "snapshot", "recovery")})
        threads = [threading.Thread(target=load.client_loop, args=(n,), daemon=True) for n in range(clients)]
        t_start = time.monotonic()
        for t in threads:
            t.start()
        next_at = t_start + sample_s
        while time.monotonic() - t_start < duration:
            time.sleep(max(0.0, next_at - time.monotonic()))
            next_at += sample_s
            w = load.take_window()
            lat = [dt * 1000 for _, dt, st in w if 200 <= st < 300]
            s = {"t_s": round(time.monotonic() - t_start, 1), "rss_mb": round(srv.rss_mb(), 1), "requests": len(w),
                 "qps": round(len(w) / sample_s, 1), "errors": sum(1 for k, _, st in w if not (200 <= st < 300 or
                                                                                           (k == "delete" and st == 404))),
                 "p50_ms": round(pct(lat, 50), 2), "p99_ms": round(pct(lat, 99), 2),
                 "writes": sum(1 for k, _, _ in w if k in ("upsert", "delete"))}
            samples.append(s)
            print(f"t={s['t_s']:6.0f}s rss={s['rss_mb']:7.1f}MB qps={s['qps']:6.1f} p50={s['p50_ms']:6.1f}ms "
                  f"p99={s['p99_ms']:7.1f}ms errors={s['errors']}", flush=True)
        load.stop.set()
        for t in threads:
            t.join(60)
        with Client(srv.url, timeout=30) as vc:
            health1, metrics = vc.health(), vc.metrics()
    finally:
        if own:
            srv.stop()
    errors = sum(v["errors"] for v in load.totals.values())
    total = sum(v["ok"] + v["errors"] for v in load.totals.values())
    minutes = np.array([s["t_s"] for s in samples]) / 60
    rss = np.array([s["rss_mb"] for s in samples])
    half = len(samples) // 2
    slope2 = float(np.polyfit(minutes[half:], rss[half:], 1)[0]) if len(samples) - half >= 3 else float("nan")
    slope1 = float(np.polyfit(minutes[:half], rss[:half], 1)[0]) if half >= 3 else float("nan")
    verdict = {
        "duration_s": duration, "clients": clients, "requests": total, "errors": errors,
        "rss_start_mb": float(rss[0]) if len(rss) else None, "rss_mid_mb": float(rss[half]) if len(rss) else None,
        "rss_end_mb": float(rss[-1]) if len(rss) else None, "rss_max_mb": float(rss.max()) if len(rss) else None,
        "rss_slope_first_half_mb_per_min": round(slope1, 3), "rss_slope_second_half_mb_per_min": round(slope2, 3),
        "growth_mid_to_end_mb": round(float(rss[-1] - rss[half]), 1) if len(rss) else None,
        "p50_ms": pct([s["p50_ms"] for s in samples], 50), "p99_ms_worst_window": max(s["p99_ms"] for s in samples),
        "degraded": [ln for ln in metrics.splitlines() if ln.startswith("vitrine_degraded_total")],
    }
    rep.add("verdict", verdict)
    rep.add("by_kind", load.totals)
    rep.add("error_samples", load.error_samples)
    rep.add("samples", samples)
    rep.add("server_end", {k: health1.get(k) for k in ("products", "model", "snapshot", "seq")})
    rep.text(
        f"Data dir `{data_dir}`: {health0.get('products')} products, index `{health0.get('index')}`, model "
        f"`{health0.get('model')}`. {clients} client threads sent back-to-back requests for {duration:.0f} s over "
        f"loopback; mix: " + ", ".join(f"{k} {v:.0%}" for k, v in MIX.items()) + f". Writes go to {n_soak_ids} ids "
        "(`soak-*`, real catalogue records and photos), with the API key; the server snapshots its indexes every "
        "30 s. The machine is shared with other work, so absolute latencies are indicative only."
    )
    rep.text(f"**Requests: {total:,}; errors: {errors}.** RSS {verdict['rss_start_mb']:.0f} MB at the first sample, "
             f"{verdict['rss_mid_mb']:.0f} MB at half time, {verdict['rss_end_mb']:.0f} MB at the end (max "
             f"{verdict['rss_max_mb']:.0f} MB); slope over the second half "
             f"{verdict['rss_slope_second_half_mb_per_min']:+.2f} MB/min (first half "
             f"{verdict['rss_slope_first_half_mb_per_min']:+.2f} MB/min).")
    rep.table([{"kind": k, **v} for k, v in load.totals.items()], ["kind", "ok", "errors"], "Requests by kind")
    if load.error_samples:
        rep.text("Errors seen:\n\n" + "\n".join(f"- `{e}`" for e in load.error_samples))

    def draw(ax) -> None:
        ts = [s["t_s"] / 60 for s in samples]
        ax.plot(ts, [s["rss_mb"] for s in samples], color="tab:blue", label="server RSS (MB)")
        ax.set_xlabel("minutes")
        ax.set_ylabel("RSS (MB)", color="tab:blue")
        ax.grid(alpha=0.3)
        ax2 = ax.twinx()
        ax2.plot(ts, [s["p50_ms"] for s in samples], color="tab:green", label="p50 (ms)", lw=1)
        ax2.plot(ts, [s["p99_ms"] for s in samples], color="tab:red", label="p99 (ms)", lw=1)
        ax2.set_ylabel("latency per window (ms)")
        lines = ax.get_lines() + ax2.get_lines()
        ax.legend(lines, [ln.get_label() for ln in lines], loc="upper left", fontsize=8)
        ax.set_title(f"Soak: RSS and latency over time ({errors} errors in {total:,} requests)")

    rep.plot("soak.png", draw)
    return rep.write()
