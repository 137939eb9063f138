"""Search-as-you-type under load: ``GET /v1/suggest`` paced against ``vitrine serve``.

The prefixes are what shoppers type on the way to real queries (the bundled catalogue's test
split: attribute queries and titles, as :mod:`vitrine_bench.api` uses): every keystroke of the
first three words, a third of them with a one-edit typo in the last word (as
vitrine/intent/typos.py makes them). Requests are due at a fixed rate over a few clients (open
loop: latency counts from when each was due), so a server that falls behind pays for its queue.
Beside it, the suggestion index alone over the full bundled catalogue (build time, lookups in
process), so the served figure can be read against the full catalogue's index cost.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

from vitrine.client import Client
from vitrine_bench.api import _paced, query_pool
from vitrine_bench.common import Report, Server, start_server, summary_ms
from vitrine_bench.encoders import matmul_flops


def prefixes(texts: list[str], n: int, seed: int = 0) -> list[str]:
    """Keystroke prefixes of ``texts``' first three words, a third with a typo in the last word."""
    from vitrine.intent.typos import typo

    rng = random.Random(seed)
    out: list[str] = []
    for t in texts:
        words = t.split()[:3]
        s = " ".join(words)
        for i in range(1, len(s) + 1):
            p = s[:i]
            if p.endswith(" "):
                continue
            if rng.random() < 1 / 3:
                head, _, last = p.rpartition(" ")
                p = (head + " " if head else "") + typo(last, rng)
            out.append(p)
    rng.shuffle(out)
    return out[:n]


def index_alone(source: Path, pool: list[str]) -> dict[str, Any]:
    """Build the suggestion index over the full bundled catalogue and time lookups in process."""
    from vitrine.index import suggest
    from vitrine.index.vocabulary import GraphData
    from vitrine.bundled import read_styles
    from vitrine.ingest.fashion import to_record

    docs = [to_record(r, "") for r in read_styles(source)]  # (no photos: the phrases are from the texts)
    brands = GraphData.load(None, None).brands
    t0 = time.perf_counter()
    idx = suggest.SuggestIndex(suggest.catalogue_phrases(docs, brand_of=brands.from_title if len(brands) else None))
    build_s = time.perf_counter() - t0
    lat = []
    for p in pool:
        t = time.perf_counter()
        idx.lookup(p, 8)
        lat.append(time.perf_counter() - t)
    return {"products": len(docs), "phrases": len(idx), "prefix_keys": len(idx.postings), "build_s": build_s,
            **summary_ms(lat)}


def run(data_dir: Path, out: Path, *, source: Path, rates: list[float], clients: int = 8, duration: float = 30.0,
        server: Server | None = None, k: int = 8) -> Path:
    texts, _ = query_pool(source, n=2000)
    pool = prefixes(texts, 20_000)
    rep = Report("suggest", out, "Search-as-you-type: GET /v1/suggest under paced load")
    alone = index_alone(source, pool[:5000])
    rep.add("index_full_catalogue", alone)
    print(f"index alone: {alone['products']} products, {alone['phrases']} phrases, build {alone['build_s']:.2f}s, "
          f"lookup p50={alone['p50_ms']:.3f}ms p99={alone['p99_ms']:.3f}ms", flush=True)
    own = server is None
    srv = server or start_server(data_dir)
    rows: list[dict[str, Any]] = []
    try:
        with Client(srv.url) as vc:
            health = vc.health()
        rep.add("server", health)

        def make(i: int) -> tuple[str, str, dict[str, Any]]:
            return ("GET", "/v1/suggest", {"params": {"q": pool[i % len(pool)], "k": str(k)}})

        asyncio.run(_paced(srv.url, clients, 50.0, 5.0, lambda i: make(i + 15_000)))  # warm-up, other prefixes
        for n_cell, rate in enumerate(rates):
            gflops = matmul_flops(1, min_time=1.0) / 1e9
            cpu0 = srv.cpu_s()
            start = n_cell * 3001
            lat, errors, elapsed = asyncio.run(_paced(srv.url, clients, rate, duration,
                                                      lambda i, s=start: make(s + i)))
            row = {"load": f"paced {rate:g}/s", "clients": clients, "qps": len(lat) / elapsed, "errors": errors,
                   **summary_ms(lat), "server_cpu_ms_per_req": (srv.cpu_s() - cpu0) * 1000 / max(1, len(lat) + errors),
                   "server_rss_mb": srv.rss_mb(), "gflops_core": gflops}
            rows.append(row)
            print(f"suggest {row['load']:>12s} qps={row['qps']:.1f} p50={row['p50_ms']:.2f}ms p99={row['p99_ms']:.2f}ms "
                  f"cpu/req={row['server_cpu_ms_per_req']:.2f}ms errors={errors} gflops/core={gflops:.0f}", flush=True)
    finally:
        if own:
            srv.stop()
    rep.add("results", rows)
    rep.text(f"Data dir: `{data_dir}` ({health.get('products')} products). Each cell: {duration:.0f} s of "
             f"`GET /v1/suggest?q=PREFIX&k={k}` over loopback (aiohttp), {clients} clients, requests due at the "
             "paced rate and latency counted from when each was due (client-side round trip). Prefixes: every "
             "keystroke of the first three words of 2,000 test-split queries (attribute queries and titles), a "
             "third with a one-edit typo in the last word, shuffled; the result cache (per prefix) is part of the "
             "server, so repeated prefixes are cheaper, as they are for a real shop. The load generator shares the "
             "machine's cores with the server. `gflops_core`: fp32 matmul GFLOP/s of one core measured just "
             "before each cell.")
    rep.table(rows, ["load", "clients", "qps", "p50_ms", "p95_ms", "p99_ms", "server_cpu_ms_per_req", "errors",
                     "server_rss_mb", "gflops_core"], "Served (HTTP, paced)")
    rep.table([alone], ["products", "phrases", "prefix_keys", "build_s", "p50_ms", "p95_ms", "p99_ms"],
              "The index alone over the full bundled catalogue (in process, no cache, 5,000 prefixes)")

    def draw(ax) -> None:
        ax.plot([float(r["load"].split()[1].rstrip("/s")) for r in rows], [r["p99_ms"] for r in rows], marker="o",
                label="p99")
        ax.plot([float(r["load"].split()[1].rstrip("/s")) for r in rows], [r["p50_ms"] for r in rows], marker="o",
                label="p50")
        ax.axhline(10, color="grey", ls="--", lw=1, label="10 ms target")
        ax.set_xlabel("paced rate (requests/s)")
        ax.set_ylabel("latency (ms)")
        ax.set_title("GET /v1/suggest latency vs paced rate")
        ax.legend()
        ax.grid(alpha=0.3)

    rep.plot("suggest.png", draw)
    return rep.write()
