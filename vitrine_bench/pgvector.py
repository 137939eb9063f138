"""`vitrine bench pgvector`: the pgvector HNSW backend against FAISS Flat (exact) on a data dir's
real vectors: recall@10, the share of filtered searches that still return k, and latency.

Base: the data dir's fused product vectors. Queries: the text vectors of a sample of products
(a title searching the catalogue, as a text query does). Filters: every product of one
category (a broad filter, ~10%) and of a small one (under 1%), as the API's facet filters do.
A throwaway PostgreSQL with pgvector is started for the run (vitrine_bench/pgserver.py).
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from vitrine_bench.common import machine, summary_ms


def run(data_dir: Path, out: Path, *, queries: int = 300, k: int = 10, ef_search: int = 128) -> Path:
    from vitrine.index.pgvectors import PgVectorIndex
    from vitrine.index.records import RecordStore
    from vitrine.index.vectors import VectorIndex
    from vitrine_bench.pgserver import PostgresServer

    rs = RecordStore(Path(data_dir) / "records.sqlite")
    rows = [r for r in rs.iter_rows(with_vectors=True) if r.vectors.get("fused") is not None]
    rs.close()
    ids = np.array([r.iid for r in rows], dtype=np.int64)
    fused = [r.vectors["fused"] for r in rows]
    base = np.stack([v for v in fused if v is not None]).astype(np.float32)
    rng = np.random.default_rng(0)
    pick = rng.choice(len(rows), size=min(queries, len(rows)), replace=False)
    qs = np.stack([rows[i].vectors.get("text") if rows[i].vectors.get("text") is not None
                   else fused[i] for i in pick]).astype(np.float32)
    by_cat: dict[str, list[int]] = defaultdict(list)
    for r in rows:
        by_cat[(r.doc.get("category") or ["?"])[-1]].append(int(r.iid))
    cats = sorted(by_cat.items(), key=lambda kv: -len(kv[1]))
    broad = cats[0]
    small = next((c for c in cats if len(c[1]) <= max(k * 2, len(rows) // 100) and len(c[1]) >= k), cats[-1])
    flat = VectorIndex(base.shape[1], "Flat")
    flat.upsert(ids, base)
    res: dict[str, Any] = {"products": len(rows), "dim": int(base.shape[1]), "queries": len(qs), "k": k,
                           "ef_search": ef_search, "machine": machine(), "data_dir": str(data_dir)}
    with PostgresServer(need_vector=True) as pg:
        url = pg.create_db("bench")
        idx = PgVectorIndex(url, "fused", base.shape[1], ef_search=ef_search)
        t0 = time.perf_counter()
        for i in range(0, len(ids), 1000):
            idx.upsert(ids[i:i + 1000], base[i:i + 1000])
        res["load_s"] = round(time.perf_counter() - t0, 2)
        import psycopg

        from vitrine.index.pgpool import scalar

        with psycopg.connect(url) as c:
            res["pgvector"] = scalar(c.execute("SELECT extversion FROM pg_extension WHERE extname='vector'"))
        for name, allowed in (("none", None), (f"broad ({broad[0]}, {len(broad[1])})", np.array(broad[1])),
                              (f"small ({small[0]}, {len(small[1])})", np.array(small[1]))):
            _, want = flat.search(qs, k, allowed)
            lat, recall, full = [], [], []
            for n, q in enumerate(qs):
                t = time.perf_counter()
                _, got = idx.search(q[None], k, allowed)
                lat.append(time.perf_counter() - t)
                w = set(want[n][want[n] >= 0].tolist())
                g = set(got[0][got[0] >= 0].tolist())
                recall.append(len(w & g) / max(1, len(w)))
                full.append(len(g) >= min(k, len(w)))
            lat_f = []
            for q in qs[:100]:
                t = time.perf_counter()
                flat.search(q[None], k, allowed)
                lat_f.append(time.perf_counter() - t)
            res.setdefault("filters", {})[name] = {
                "recall_at_k": round(float(np.mean(recall)), 4), "returned_k": round(float(np.mean(full)), 4),
                "pgvector_ms": summary_ms(lat), "faiss_flat_ms": summary_ms(lat_f)}
        idx.close()
    out.mkdir(parents=True, exist_ok=True)
    (out / "pgvector.json").write_text(json.dumps(res, indent=2))
    lines = ["# pgvector HNSW vs FAISS Flat", "",
             f"`vitrine bench pgvector --data {data_dir}`: {res['products']} products' fused vectors "
             f"({res['dim']}-d) in pgvector {res['pgvector']} (HNSW m=16, ef_construction=64, ef_search={ef_search}, "
             "iterative scan relaxed_order), queried by the text vectors of "
             f"{res['queries']} of them; FAISS Flat (exact) is the reference. Loaded in {res['load_s']} s. "
             "Latency: one query at a time over loopback, on a 2-core machine shared with other jobs "
             "(noisy; compare the columns, not the absolute numbers).", "",
             "| filter | recall@10 | searches returning k | pgvector p50 / p99 ms | FAISS Flat p50 / p99 ms |",
             "|---|---|---|---|---|"]
    for name, f in res["filters"].items():
        lines.append(f"| {name} | {f['recall_at_k']:.3f} | {f['returned_k']:.3f} | "
                     f"{f['pgvector_ms']['p50_ms']:.2f} / {f['pgvector_ms']['p99_ms']:.2f} | "
                     f"{f['faiss_flat_ms']['p50_ms']:.2f} / {f['faiss_flat_ms']['p99_ms']:.2f} |")
    lines += ["", f"Machine: {json.dumps(res['machine'])}"]
    path = out / "pgvector.md"
    path.write_text("\n".join(lines) + "\n")
    return path
