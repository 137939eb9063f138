"""What a catalogue's size costs, end to end, at each size asked (10k, 100k, 1M ...).

Per size: `vitrine make-catalogue` (synthetic text-only products over Google's taxonomy, and
judged queries, vitrine/evals/synthetic.py), then as a user runs it: `vitrine ingest --jobs J`
(the whole command's wall clock, cold feature cache, tuning off), the data dir's size on disk,
`vitrine serve` (one worker) started on it (the open time: a restart), its RSS and PSS after a
warm-up, text searches one client at a time over the test queries (p50/p99 round trip; nDCG@10
against the judgements: a check that search still works at that size, on generated text), facet
counts, and a deep page. Each size ingests into a data dir of its own under ``work``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from vitrine.metrics import ndcg_at_k
from vitrine_bench.common import Report, start_server, summary_ms
from vitrine_bench.encoders import matmul_flops
from vitrine_bench.worker_memory import smaps


def _du_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def _cli(args: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "vitrine.cli.__main__", *args], env=env, capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"vitrine {' '.join(args[:2])} failed: {done.stderr[-2000:]}")
    return time.perf_counter() - t0


def one_size(n: int, work: Path, *, jobs: int, n_queries: int, env: dict[str, str], reuse: bool = False,
             workers: tuple[int, ...] = (1, 2)) -> dict[str, Any]:
    """Make and ingest a catalogue of ``n`` products (``reuse``: measure the catalogue and data
    dir a previous run left in ``work``, with the ingest time it recorded), then serve it with each
    number of ``workers`` in turn."""
    cat, data, done = work / f"cat-{n}", work / f"data-{n}", work / f"ingest-{n}.json"
    if reuse and data.is_dir() and done.is_file():
        row: dict[str, Any] = json.loads(done.read_text())
    else:
        shutil.rmtree(data, ignore_errors=True)
        t_make = _cli(["make-catalogue", "--n", str(n), "--out", str(cat), "--queries", str(n_queries * 2)], env)
        t_ingest = _cli(["--log-level", "WARNING", "ingest", str(cat / "catalog.jsonl"), "--data", str(data),
                         "--jobs", str(jobs)], env)
        row = {"products": n, "make_s": round(t_make, 1), "ingest_s": round(t_ingest, 1),
               "products_per_s": round(n / t_ingest, 1)}
        done.write_text(json.dumps(row))
    row["data_dir_mb"] = round(_du_mb(data), 1)
    queries = [json.loads(x) for x in (cat / "queries.jsonl").read_text().splitlines()]
    test = [q for q in queries if q["split"] == "test"][:n_queries]
    for w in workers:
        got = _serve_and_search(data, test, {**env, "VITRINE_WORKERS": str(w)})
        row.update(got if w == 1 else {f"{k}_{w}w": v for k, v in got.items()})
    return row


def _serve_and_search(data: Path, test: list[dict[str, Any]], env: dict[str, str]) -> dict[str, Any]:
    """`vitrine serve` on ``data``: its start time, memory after the searches, search round trips
    one client at a time with nDCG@10, a facet request and a deep page."""
    t0 = time.perf_counter()
    server = start_server(data, env=env, timeout=3600)
    row: dict[str, Any] = {"open_s": round(time.perf_counter() - t0, 1)}
    try:
        lat, nd = [], []
        with httpx.Client(base_url=server.url + "/v1", timeout=60) as c:
            for q in test[:20]:  # warm-up
                c.post("/search", json={"text": q["text"], "k": 10})
            for q in test:
                t = time.perf_counter()
                r = c.post("/search", json={"text": q["text"], "k": 10, "use_intent": False})
                lat.append(time.perf_counter() - t)
                r.raise_for_status()
                nd.append(ndcg_at_k([h["id"] for h in r.json()["results"]], q["relevant"], 10))
            t = time.perf_counter()
            facets = c.post("/search", json={"text": test[0]["text"], "k": 10, "facets": ["brand", "category"]})
            facets.raise_for_status()
            t_facets = time.perf_counter() - t
            t = time.perf_counter()
            # the deepest page the default max_k (100) allows
            deep = c.post("/search", json={"text": test[1]["text"], "k": 10, "offset": 90})
            t_deep = time.perf_counter() - t
        mem = {"rss_mb": 0.0, "pss_mb": 0.0}
        for pid in server.pids():
            m = smaps(pid)
            mem["rss_mb"] += m.get("rss_mb", 0.0)
            mem["pss_mb"] += m.get("pss_mb", 0.0)
        s = summary_ms(lat)
        row.update({"rss_mb": round(mem["rss_mb"]), "pss_mb": round(mem["pss_mb"]), "search_p50_ms": round(s["p50_ms"], 1),
                    "search_p99_ms": round(s["p99_ms"], 1), "facets_ms": round(t_facets * 1000, 1),
                    "deep_page_ms": round(t_deep * 1000, 1), "deep_page_status": deep.status_code,
                    "queries": len(test), "nDCG@10": round(sum(nd) / len(nd), 4)})
    finally:
        server.stop()
    return row


def run(out: Path, *, sizes: list[int], work: Path, jobs: int = 2, n_queries: int = 200, reuse: bool = False) -> Path:
    rep = Report("growth", out, "What the catalogue's size costs: ingest, disk, memory, restart, search")
    rep.add("gflops_per_core_before", round(matmul_flops(1) / 1e9, 1))
    env = {**os.environ, "VITRINE_TUNE_AFTER_INGEST": "false", "VITRINE_CACHE_DIR": str(work / "cache")}
    rows = []
    for n in sizes:
        rows.append(one_size(n, work, jobs=jobs, n_queries=n_queries, env=env, reuse=reuse))
        rep.data["rows"] = rows
    rep.add("gflops_per_core_after", round(matmul_flops(1) / 1e9, 1))
    rep.text(
        "Synthetic text-only catalogues (`vitrine make-catalogue --n N`: Google taxonomy leaf categories, invented "
        "brands, generated titles and descriptions; generated text, not shoppers). Per size: `vitrine ingest --jobs "
        f"{jobs}` (whole command, cold feature cache, tuning off), data dir size, `vitrine serve` start time and "
        "memory (one worker, then `--workers 2`: the total over its processes, after the searches), text search round trips one client at a time over the catalogue's "
        "test queries (nDCG@10 against their attribute judgements), one facet request, one page at offset 90 "
        "(the deepest the default max_k allows). "
        f"Command: `vitrine bench growth --sizes {','.join(map(str, sizes))}`. Machine: "
        f"{rep.data['gflops_per_core_before']} / {rep.data['gflops_per_core_after']} GFLOP/s per core "
        "(fp32 matmul, before / after).")
    rep.table(rows, ["products", "ingest_s", "products_per_s", "data_dir_mb", "open_s", "rss_mb", "pss_mb",
                     "search_p50_ms", "search_p99_ms", "facets_ms", "deep_page_ms", "nDCG@10"], "Per size, one worker")
    rep.table(rows, ["products", "open_s_2w", "rss_mb_2w", "pss_mb_2w", "search_p50_ms_2w", "search_p99_ms_2w",
                     "facets_ms_2w", "deep_page_ms_2w", "nDCG@10_2w"], "Per size, `--workers 2` (all its processes)")

    def draw(ax: Any) -> None:
        xs = [r["products"] for r in rows]
        ax.loglog(xs, [r["ingest_s"] for r in rows], "o-", label="ingest s")
        ax.loglog(xs, [r["rss_mb"] for r in rows], "s-", label="RSS MB (one worker)")
        ax.loglog(xs, [r.get("pss_mb_2w") for r in rows], "s--", label="PSS MB (--workers 2, all processes)")
        ax.loglog(xs, [r["open_s"] for r in rows], "v-", label="start s (one worker)")
        ax.loglog(xs, [r["data_dir_mb"] for r in rows], "^-", label="data dir MB")
        ax.loglog(xs, [r["search_p99_ms"] for r in rows], "d-", label="search p99 ms")
        ax.set_xlabel("products")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3, which="both")
        ax.set_title("Costs as the catalogue grows")

    if len(rows) > 1:
        rep.plot("growth.png", draw)
    return rep.write()
