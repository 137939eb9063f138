"""Knowledge-graph and BM25 benchmark: build over the full catalogue, single-product upsert and
delete, graph file save/load (time, memory), and, given a data dir, what hybrid ranking
costs per search compared with vector-only ranking."""

from __future__ import annotations

import gc
import os
import random
import sqlite3
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

from vitrine_bench.common import Report, summary_ms


def rss_mb() -> float:
    try:
        for line in Path(f"/proc/{os.getpid()}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def run(out: Path, *, source: Path, data_dir: Path | None = None, upserts: int = 500, searches: int = 200) -> Path:
    from vitrine.index import symbolic
    from vitrine.index.graph import ProductGraph
    from vitrine.index.vocabulary import GraphData
    from vitrine.bundled import read_styles
    from vitrine.ingest.fashion import to_record
    from vitrine.settings import Settings

    rep = Report("graph", out, "Vitrine knowledge graph and BM25: build, upsert, persistence")
    settings = Settings()
    rows = read_styles(source)
    docs = [(i + 1, r["id"], to_record(r, f"images/{r['id']}.jpg")) for i, r in enumerate(rows)]
    t0 = time.perf_counter()
    data = GraphData.load(settings.index.graph_dir, settings.index.taxonomy_file)
    t_data = time.perf_counter() - t0

    # build: time without tracing, then memory with tracemalloc in a second build
    gc.collect()
    rss0 = rss_mb()
    t0 = time.perf_counter()
    g = ProductGraph(data)
    t_backbone = time.perf_counter() - t0
    g.upsert_many(docs)
    t_build = time.perf_counter() - t0
    gc.collect()
    rss_build = rss_mb() - rss0
    del g
    gc.collect()
    tracemalloc.start()
    g2 = ProductGraph(GraphData.load(settings.index.graph_dir, settings.index.taxonomy_file))
    g2.upsert_many(docs)
    cur, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    g = g2
    stats = g.stats()

    # single-product upsert (update of an existing product, and a new product) and delete
    rng = random.Random(0)
    upd, ins, dele = [], [], []
    sample = rng.sample(docs, min(upserts, len(docs)))
    for iid, pid, doc in sample:
        d = dict(doc, title=doc["title"] + " v2")
        t = time.perf_counter()
        g.upsert(iid, pid, d)
        upd.append(time.perf_counter() - t)
    for n, (_, pid, doc) in enumerate(sample):
        t = time.perf_counter()
        g.upsert(10_000_000 + n, f"new-{pid}", doc)
        ins.append(time.perf_counter() - t)
    for _, pid, _ in sample:
        t = time.perf_counter()
        g.delete([f"new-{pid}"])
        dele.append(time.perf_counter() - t)

    # persistence: the graph file (node-link JSON of the values, the products' code rows)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "graph.varr"
        t = time.perf_counter()
        sha = g.save(path)
        t_save = time.perf_counter() - t
        size_mb = path.stat().st_size / 1e6
        t = time.perf_counter()
        ProductGraph.load(path, g.data, sha)
        t_load = time.perf_counter() - t

        # BM25 (FTS5) beside it: bulk index and a single-row write, in a scratch SQLite file
        conn = sqlite3.connect(Path(tmp) / "fts.sqlite", isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")  # as the record store
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        conn.execute("CREATE TABLE products (iid INTEGER PRIMARY KEY, doc TEXT, deleted INTEGER)")
        conn.execute(symbolic.SCHEMA)
        t = time.perf_counter()
        conn.execute("BEGIN")
        for iid, _, doc in docs:
            symbolic.write(conn, iid, doc)
        conn.execute("COMMIT")
        t_fts = time.perf_counter() - t
        fts_one = []
        for iid, _, doc in sample[:200]:
            t = time.perf_counter()
            conn.execute("BEGIN")
            symbolic.write(conn, iid, doc)
            conn.execute("COMMIT")
            fts_one.append(time.perf_counter() - t)
        fts_q = []
        for _, _, doc in sample[:200]:
            t = time.perf_counter()
            symbolic.search(conn, doc["title"], 100)
            fts_q.append(time.perf_counter() - t)
        conn.close()

    build = {"products": len(docs), "graph_data_load_s": t_data, "backbone_s": t_backbone, "build_s": t_build,
             "products_per_s": len(docs) / t_build, "rss_delta_mb": rss_build,
             "traced_mb": cur / 2**20, "traced_peak_mb": peak / 2**20, **stats,
             "save_s": t_save, "load_s": t_load, "json_mb": size_mb, "fts_bulk_s": t_fts}
    ops = [{"op": "graph upsert (update)", **summary_ms(upd)}, {"op": "graph upsert (new product)", **summary_ms(ins)},
           {"op": "graph delete", **summary_ms(dele)}, {"op": "BM25 row write (own WAL transaction, fsync)", **summary_ms(fts_one)},
           {"op": "BM25 query (title, top 100)", **summary_ms(fts_q)}]
    rep.add("build", build)
    rep.add("ops", ops)
    rep.text(f"The product graph over the full bundled catalogue ({len(docs)} products, networkx "
             "MultiDiGraph: products, brands, categories, Google-taxonomy backbone, attribute values, "
             "complement edges). Memory: RSS growth of the process over the build, and Python allocations "
             "still held after the build (tracemalloc).")
    rep.table([build], ["products", "build_s", "products_per_s", "rss_delta_mb", "traced_mb", "nodes", "edges",
                        "save_s", "load_s", "json_mb", "fts_bulk_s"], "Build over the full catalogue")
    rep.table(ops, ["op", "p50_ms", "p95_ms", "p99_ms", "mean_ms", "n"], "Single-product operations")

    search_rows: list[dict[str, Any]] = []
    if data_dir is not None:
        search_rows = _search_cost(data_dir, searches, source)
        rep.add("search", search_rows)
        rep.table(search_rows, ["fusion", "p50_ms", "p95_ms", "p99_ms", "mean_ms", "n"],
                  f"Search latency on {data_dir} (text queries, k=10, in process)")

    def draw(ax):
        ax.hist([np.array(upd) * 1000, np.array(ins) * 1000], bins=40, label=["update", "new product"],
                color=["#4c72b0", "#dd8452"])
        ax.set_xlabel("graph upsert latency (ms)")
        ax.set_ylabel("operations")
        ax.legend()

    rep.plot("graph_upsert.png", draw)
    print(build)
    for o in ops + search_rows:
        print(o)
    return rep.write()


def _search_cost(data_dir: Path, n: int, source: Path) -> list[dict[str, Any]]:
    from vitrine.evals.attribute_queries import eval_queries
    from vitrine.bundled import read_splits, read_styles
    from vitrine.search.engine import Engine
    from vitrine.search.models import SearchRequest
    from vitrine.settings import Settings

    rows = read_styles(source)
    splits = read_splits(source)
    seeds = [i for i, r in enumerate(rows) if splits.get(r["id"]) == "test"]
    texts = [q["text"] for q in eval_queries(rows, seeds, n=n, seed=3)]
    # ranking cost only; calibration off: the configured fusion ranks text (at the floor of an untuned
    # catalogue every fusion setting would rank by the text tower's cosine alone)
    engine = Engine.open(Settings(data_dir=data_dir, intent=False, calibration="off"))
    out = []
    try:
        for q in texts:  # warm up: every query's text features computed (and cached) once
            engine.search(SearchRequest(text=q, k=10))
        for fusion in ("off", "rrf", "weighted"):
            engine.settings.search.fusion = fusion
            lat = []
            for q in texts:
                t = time.perf_counter()
                engine.search(SearchRequest(text=q, k=10))
                lat.append(time.perf_counter() - t)
            out.append({"fusion": fusion, **summary_ms(lat)})
    finally:
        engine.records.close()
    return out
