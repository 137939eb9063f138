"""Vector index trade-offs: build time, memory, recall@10 against exact search and queries/s,
for Flat, HNSW (efSearch sweep), IVF-Flat and IVF-PQ (nprobe sweep), one query at a time and
in batches, on two vector sets:

- the real catalogue: the fused product vectors of a full-catalogue data dir;
- N (default 1M) 256-d vectors made from those real embeddings: the real vectors plus points
  on the segments between each real vector and one of its 16 nearest real neighbours, with
  Gaussian noise of half the median nearest-neighbour distance, re-normalised. This keeps the
  catalogue's own uneven, anisotropic density (categories of very different sizes, near-
  duplicate titles) instead of isotropic noise or neat blobs, which flatter IVF (on such data
  IVF is exact at nprobe 4).

Queries are real search queries (attribute queries and product titles of the test split)
encoded by the query text tower + adapter: the vectors a text search really sends to the
fused index. Ground truth is exact inner-product search over the same vectors.

Every index is built through Vitrine's own ``VectorIndex`` (its training sample, its add path)
so build time is what a user waits; the sweeps then set nprobe/efSearch on its FAISS index.
"""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from vitrine.index.vectors import TRAIN_PER_LIST
from vitrine_bench.common import Report

K = 10


def rss_mb() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


# -- data ------------------------------------------------------------------------------------------
def catalogue_vectors(data_dir: Path, field: str = "fused") -> np.ndarray:
    """The live vectors of a data dir's index snapshot (no models needed)."""
    from vitrine.errors import StorageError
    from vitrine.index.snapshots import SnapshotStore
    from vitrine.index.vectors import VectorIndex

    # the newest version whose file loads and matches its checksum, falling back as the engine does
    name = f"{field}.vidx"
    for snap in SnapshotStore(Path(data_dir) / "index").candidates():
        try:
            vi = VectorIndex.load(snap.file(name), snap.sha256(name))
        except (StorageError, OSError, ValueError):
            continue
        return vi.get(vi.ids())
    raise SystemExit(f"{data_dir} holds no readable index snapshot: run `vitrine ingest` into it first")


def query_texts(source: Path, n: int, seed: int = 0) -> list[str]:
    from vitrine_bench.api import query_pool

    texts, _ = query_pool(source, n=n, seed=seed)
    return texts


def encode_queries(texts: list[str]) -> tuple[np.ndarray, str]:
    """Real query vectors: the query fast path of the default encoder (text -> shared space)."""
    from vitrine.encoders.queries import QueryEncoder
    from vitrine.search.engine import build_encoder
    from vitrine.settings import Settings

    settings = Settings(_env_file=None)
    enc = build_encoder(settings)
    qe = QueryEncoder(enc, cache_size=0, max_batch=64, max_wait_ms=0)
    vecs = np.concatenate([qe.text(texts[i:i + 256]) for i in range(0, len(texts), 256)])
    qe.close()
    return np.ascontiguousarray(vecs, dtype=np.float32), enc.model_key


def synthesize(base: np.ndarray, n: int, *, seed: int = 0, neighbours: int = 16, noise: float = 0.5) -> np.ndarray:
    """``n`` unit vectors grown from ``base`` (kept as the first rows): x_a + t (x_b - x_a) + e,
    b one of a's ``neighbours`` nearest, t ~ U(0, 1), e Gaussian with norm ~ ``noise`` x the
    median nearest-neighbour distance; then L2-normalised."""
    import faiss

    rng = np.random.default_rng(seed)
    nb, d = base.shape
    flat = faiss.IndexFlatIP(d)
    flat.add(base)
    sims, nbr = flat.search(base, neighbours + 1)
    nn_dist = np.sqrt(np.clip(2 - 2 * sims[:, 1], 0, None))
    sigma = noise * float(np.median(nn_dist)) / np.sqrt(d)
    out = np.empty((n, d), dtype=np.float32)
    out[:nb] = base
    for s in range(nb, n, 200_000):
        m = min(200_000, n - s)
        a = rng.integers(0, nb, m)
        b = nbr[a, rng.integers(1, neighbours + 1, m)]
        t = rng.random(m, dtype=np.float32)[:, None]
        v = base[a] * (1 - t) + base[b] * t + rng.standard_normal((m, d), dtype=np.float32) * sigma
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        out[s:s + m] = v
    return out


def exact_topk(base: np.ndarray, queries: np.ndarray, k: int = K) -> np.ndarray:
    import faiss

    flat = faiss.IndexFlatIP(base.shape[1])
    flat.add(base)
    _, ids = flat.search(queries, k)
    return ids


def relative_contrast(base: np.ndarray, queries: np.ndarray, gt: np.ndarray, seed: int = 0) -> float:
    """Mean distance to a random point over distance to the 10th neighbour (lower = harder)."""
    rng = np.random.default_rng(seed)
    sample = base[rng.choice(len(base), min(len(base), 5000), replace=False)]
    d_rand = np.sqrt(np.clip(2 - 2 * (queries @ sample.T), 0, None)).mean(1)
    s10 = np.einsum("ij,ij->i", queries, base[gt[:, -1]])
    d10 = np.sqrt(np.clip(2 - 2 * s10, 1e-12, None))
    return float(np.mean(d_rand / d10))


# -- measuring ---------------------------------------------------------------------------------------
def recall_at_k(found: np.ndarray, gt: np.ndarray) -> float:
    k = gt.shape[1]
    return float(np.mean([len(set(f[:k].tolist()) & set(g.tolist())) / k for f, g in zip(found, gt)]))


def index_bytes(index: Any) -> int:
    import faiss

    return int(faiss.serialize_index(index).nbytes)


def set_param(index: Any, factory: str, value: int) -> None:
    import faiss

    if factory.startswith("IVF"):
        faiss.extract_index_ivf(index).nprobe = value
    elif factory.startswith("HNSW"):
        index.hnsw.efSearch = value


def time_single(search, queries: np.ndarray, budget_s: float, max_n: int) -> tuple[float, np.ndarray]:
    """Queries/s one query at a time (as a request handler calls it) within a time budget."""
    lat = []
    t_end = time.perf_counter() + budget_s
    for i in range(min(max_n, len(queries))):
        q = queries[i:i + 1]
        t0 = time.perf_counter()
        search(q)
        lat.append(time.perf_counter() - t0)
        if time.perf_counter() > t_end and len(lat) >= 5:
            break
    return len(lat) / float(np.sum(lat)), np.asarray(lat)


def time_batch(search, queries: np.ndarray, reps: int = 2) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(reps):
        t0 = time.perf_counter()
        res = search(queries)
        best = min(best, time.perf_counter() - t0)
        out = res
    return len(queries) / best, out


def pareto(points: list[dict[str, Any]], qps_key: str) -> list[dict[str, Any]]:
    """Points no other point beats on both recall and speed, fastest first."""
    pts = sorted(points, key=lambda p: (-p[qps_key], -p["recall@10"]))
    front, best = [], -1.0
    for p in pts:
        if p["recall@10"] > best:
            front.append(p)
            best = p["recall@10"]
    return front


def sweep_values(factory: str) -> list[int | None]:
    if factory.startswith("HNSW"):
        return [16, 32, 64, 128, 256]
    if factory.startswith("IVF"):
        nlist = int(factory[3:].split(",")[0].split("_")[0])
        return [p for p in (1, 2, 4, 8, 16, 32, 64, 128, 256) if p <= nlist]
    return [None]


def bench_set(name: str, base: np.ndarray, queries: np.ndarray, factories: list[str], *,
              single_budget_s: float, batch_size: int, log) -> dict[str, Any]:
    """Build every factory over ``base`` with VectorIndex, sweep its parameter, measure."""
    from vitrine.index.vectors import VectorIndex

    n, d = base.shape
    t0 = time.perf_counter()
    gt = exact_topk(base, queries)
    log(f"[{name}] ground truth for {len(queries)} queries over {n:,} vectors in {time.perf_counter() - t0:.1f}s")
    rc = relative_contrast(base, queries, gt)
    ids = np.arange(n, dtype=np.int64)
    qb = queries[:batch_size]
    rows: list[dict[str, Any]] = []
    overhead: dict[str, Any] = {}
    for factory in factories:
        gc.collect()
        r0 = rss_mb()
        t0 = time.perf_counter()
        vi = VectorIndex(d, factory, use_gpu="never")
        vi.upsert(ids, base)
        build_s = time.perf_counter() - t0
        mem = index_bytes(vi._index) if vi._index is not None else base.nbytes
        log(f"[{name}] {factory}: built in {build_s:.1f}s, {mem / 2**20:.0f} MiB (RSS +{rss_mb() - r0:.0f} MiB)")
        raw = vi._index
        for v in sweep_values(factory):
            if v is not None:
                set_param(raw, factory, v)
            qps1, _ = time_single(lambda q, r=raw: r.search(q, K), queries, single_budget_s,
                                  max_n=len(queries) if factory != "Flat" else 60)
            qpsb, (_, found) = time_batch(lambda q, r=raw: r.search(q, K), qb, reps=1 if factory == "Flat" else 2)
            rec = recall_at_k(found, gt[:batch_size])
            param = ("nprobe" if factory.startswith("IVF") else "efSearch" if factory.startswith("HNSW") else None)
            row = {"set": name, "factory": factory, "param": param, "value": v, "recall@10": rec,
                   "qps_single": qps1, "qps_batch": qpsb, "build_s": build_s, "index_mib": mem / 2**20}
            rows.append(row)
            log(f"[{name}] {factory} {param or ''}={v if v is not None else '-'}: recall@10={rec:.3f} "
                f"single={qps1:,.0f}/s batch={qpsb:,.0f}/s")
        # the engine's vector stage vs raw FAISS on this index, at the parameter a 0.95 recall needs
        if factory != "Flat":
            good = [r for r in rows if r["factory"] == factory and r["recall@10"] >= 0.95]
            pick = min(good, key=lambda r: r["value"]) if good else rows[-1]
            v = pick["value"]
        else:
            v = None
        if v is not None:
            set_param(raw, factory, v)
            vi.nprobe = v if factory.startswith("IVF") else vi.nprobe
            vi.ef_search = v if factory.startswith("HNSW") else vi.ef_search
        overhead[factory] = overhead_ratio(vi, raw, queries, budget_s=min(single_budget_s, 3.0))
        overhead[factory]["value"] = v
        log(f"[{name}] {factory} overhead VectorIndex/raw = {overhead[factory]['ratio_single']:.3f} (single), "
            f"{overhead[factory]['ratio_batch']:.3f} (batch)")
        del vi, raw
        gc.collect()
    return {"n": n, "dim": d, "queries": len(queries), "relative_contrast": rc, "rows": rows,
            "overhead": overhead}


def overhead_ratio(vi: Any, raw: Any, queries: np.ndarray, *, budget_s: float, rounds: int = 3) -> dict[str, float]:
    """Per-query time of VectorIndex.search over raw FAISS search on the same index and queries
    (interleaved rounds, best of each, so drifting machine load cancels out)."""
    nq = min(len(queries), 300)
    qs = queries[:nq]

    def loop(fn) -> float:
        t0 = time.perf_counter()
        t_end = t0 + budget_s
        done = 0
        for i in range(nq):
            fn(qs[i:i + 1])
            done += 1
            if time.perf_counter() > t_end and done >= 5:
                break
        return (time.perf_counter() - t0) / done

    raw_t, vi_t = [], []
    for _ in range(rounds):
        raw_t.append(loop(lambda q: raw.search(q, K)))
        vi_t.append(loop(lambda q: vi.search(q, K)))
    rb, vb = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        raw.search(qs, K)
        rb.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        vi.search(qs, K)
        vb.append(time.perf_counter() - t0)
    return {"raw_ms": min(raw_t) * 1000, "vectorindex_ms": min(vi_t) * 1000,
            "ratio_single": min(vi_t) / min(raw_t), "ratio_batch": min(vb) / min(rb)}


# -- the command -------------------------------------------------------------------------------------
DEFAULT_CATALOGUE = ["Flat", "SQfp16", "HNSW32", "IVF256,Flat", "IVF256,PQ32"]
DEFAULT_LARGE = ["Flat", "HNSW32", "IVF4096,Flat", "IVF4096,PQ32"]


def run(data_dir: Path, out: Path, *, source: Path, n_large: int, n_queries: int, batch_size: int,
        catalogue_factories: list[str], large_factories: list[str], single_budget_s: float,
        skip_catalogue: bool = False, skip_large: bool = False) -> Path:
    import faiss

    rep = Report("index", out, "Vitrine vector index: recall vs speed, build time, memory")
    load0 = os.getloadavg()
    lines: list[str] = []

    def log(msg: str) -> None:
        print(msg, flush=True)
        lines.append(msg)

    base = catalogue_vectors(data_dir)
    texts = query_texts(source, n_queries)
    queries, model_key = encode_queries(texts)
    log(f"catalogue: {len(base):,} x {base.shape[1]} fused vectors; {len(queries)} real text queries "
        f"(model {model_key}); faiss {faiss.__version__}, {faiss.omp_get_max_threads()} OpenMP threads")
    sets: dict[str, Any] = {}
    if not skip_catalogue:
        sets["catalogue"] = bench_set("catalogue", base, queries, catalogue_factories,
                                      single_budget_s=single_budget_s, batch_size=batch_size, log=log)
    if not skip_large:
        t0 = time.perf_counter()
        big = synthesize(base, n_large)
        log(f"synthesized {len(big):,} vectors from the catalogue's in {time.perf_counter() - t0:.1f}s")
        sets["large"] = bench_set(f"{len(big) // 1000}k", big, queries, large_factories,
                                  single_budget_s=single_budget_s, batch_size=batch_size, log=log)
        del big
    rep.add("sets", sets)
    rep.add("load_avg", {"start": load0, "end": os.getloadavg()})
    rep.add("log", lines)

    rep.text(
        f"Queries: {len(queries)} real text queries (attribute queries + test-split titles) through the "
        f"query text tower + adapter (`{model_key}`); recall@10 against exact inner-product search over the "
        f"same vectors. *Single*: one query per call (a request handler; FAISS then uses one thread), "
        f"*batch*: {batch_size} queries per call (FAISS spreads them over the cores). Every index is built "
        f"by Vitrine's `VectorIndex` (its IVF training sample: {TRAIN_PER_LIST} points per list). Memory = serialized "
        f"FAISS index (VectorIndex also keeps the float32 rows: n x 1 KiB). Machine load average "
        f"{load0[0]:.2f} at start, {os.getloadavg()[0]:.2f} at end (2 shared cores).")
    for key, s in sets.items():
        rows = s["rows"]
        exact = next((r for r in rows if r["factory"] == "Flat"), None)
        title = "Real catalogue" if key == "catalogue" else f"{s['n']:,} vectors grown from the catalogue"
        rep.text(f"## {title} ({s['n']:,} x {s['dim']})\n\nRelative contrast of the queries (mean distance "
                 f"to a random vector / distance to the 10th neighbour): {s['relative_contrast']:.2f}.")
        for r in rows:
            if exact:
                r["speedup_single"] = r["qps_single"] / exact["qps_single"]
                r["speedup_batch"] = r["qps_batch"] / exact["qps_batch"]
        rep.table(rows, ["factory", "param", "value", "recall@10", "qps_single", "speedup_single", "qps_batch",
                         "speedup_batch", "build_s", "index_mib"], f"{title}: sweep")
        for mode in ("single", "batch"):
            front = pareto(rows, f"qps_{mode}")
            ok = [r for r in rows if r["recall@10"] >= 0.95]
            best = max(ok, key=lambda r: r[f"qps_{mode}"]) if ok else None
            txt = (f"**{mode}**: Pareto front (fastest first): " + "; ".join(
                f"{r['factory']}{'/' + r['param'] + '=' + str(r['value']) if r['param'] else ''} "
                f"(R@10 {r['recall@10']:.3f}, {r[f'qps_{mode}']:,.0f} q/s)" for r in front) + ".")
            if best is not None and exact is not None:
                txt += (f" Fastest at recall@10 >= 0.95: **{best['factory']}"
                        f"{' ' + best['param'] + '=' + str(best['value']) if best['param'] else ''}**, "
                        f"{best[f'qps_{mode}']:,.0f} q/s = {best[f'speedup_{mode}']:.1f}x exact "
                        f"(R@10 {best['recall@10']:.3f}).")
            rep.text(txt)
        ov = s["overhead"]
        rep.table([{"factory": f, "value": o.get("value"), **o} for f, o in ov.items()],
                  ["factory", "value", "raw_ms", "vectorindex_ms", "ratio_single", "ratio_batch"],
                  f"{title}: VectorIndex.search over raw FAISS search (same index, same queries)")

        def draw(ax, rows=rows, mode="single") -> None:
            for f in dict.fromkeys(r["factory"] for r in rows):
                pts = [r for r in rows if r["factory"] == f]
                ax.plot([r["recall@10"] for r in pts], [r[f"qps_{mode}"] for r in pts], marker="o", label=f)
                for r in pts:
                    if r["value"] is not None:
                        ax.annotate(str(r["value"]), (r["recall@10"], r[f"qps_{mode}"]), fontsize=7)
            ax.axvline(0.95, color="grey", ls=":", lw=1)
            ax.set_yscale("log")
            ax.set_xlabel("recall@10 vs exact")
            ax.set_ylabel("queries / s")
            ax.set_title(f"{title}: {mode} queries (labels: nprobe / efSearch)")
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=8)

        for mode in ("single", "batch"):
            rep.plot(f"index_{key}_{mode}.png", lambda ax, rows=rows, mode=mode: draw(ax, rows, mode))
    rep.text(defaults_text(sets))
    return rep.write()


def defaults_text(sets: dict[str, Any]) -> str:
    """Why Vitrine's index defaults are what they are, from this run's Pareto fronts."""
    out = ["## Defaults, and why"]
    cat = sets.get("catalogue")
    if cat:
        flat = next((r for r in cat["rows"] if r["factory"] == "Flat"), None)
        sq = next((r for r in cat["rows"] if r["factory"] == "SQfp16"), None)
        if flat:
            out.append(
                f"- An exhaustive scan for catalogues the size of ours: exact, and a Flat query costs "
                f"{1000 / flat['qps_single']:.1f} ms over {cat['n']:,} products, small next to the rest of a "
                "search (6-15 ms of server CPU per request under load, `api_load_workers2.md`); nothing to "
                "train, upserts are instant. An ANN index buys nothing a shopper would notice here and costs recall.")
        if sq:
            out.append(
                f"- `VITRINE_INDEX_FACTORY=SQfp16` (the default): the same scan over float16 copies, "
                f"{1000 / sq['qps_single']:.2f} ms per query (raw FAISS, recall@10 {sq['recall@10']:.3f} before "
                "Vitrine scores its hits again exactly from the float32 rows; the VectorIndex/raw ratio below "
                "includes that). A single-query scan is bound by memory bandwidth and this one reads half the "
                "bytes; Flat stays the choice on a GPU host (its GPU copy).")
    big = sets.get("large")
    if big:
        ok = [r for r in big["rows"] if r["recall@10"] >= 0.95 and r["factory"].startswith("IVF")]
        if ok:
            best = max(ok, key=lambda r: r["qps_single"])
            safer = [r for r in ok if r["factory"] == best["factory"] and r["recall@10"] >= 0.98]
            s16 = min(safer, key=lambda r: r["value"]) if safer else best
            out.append(
                f"- Past a few hundred thousand products: `IVF{{4*sqrt(n)}},Flat` (here {best['factory']}). On the "
                f"{big['n']:,} vectors the fastest setting at recall@10 >= 0.95 is nprobe={best['value']} "
                f"(R@10 {best['recall@10']:.3f}, {best['qps_single']:,.0f} q/s one at a time); the default "
                f"`VITRINE_NPROBE=16` sits one step up the front (nprobe={s16['value']}: R@10 "
                f"{s16['recall@10']:.3f}, {s16['qps_single']:,.0f} q/s) for margin on catalogues we have not seen.")
        hnsw = [r for r in big["rows"] if r["factory"].startswith("HNSW")]
        if hnsw:
            top = max(hnsw, key=lambda r: r["recall@10"])
            small = [r for r in (cat or {}).get("rows", []) if r["factory"].startswith("HNSW")]
            low = min(small, key=lambda r: r["value"]) if small else None
            pq = [r for r in big["rows"] if "PQ" in r["factory"]]
            out.append(
                f"- HNSW32 at this size: best R@10 {top['recall@10']:.3f} (efSearch={top['value']}, FAISS's default "
                "efConstruction 40); it takes more memory than IVF-Flat and has no GPU version"
                + (f"; on our catalogue it reaches R@10 {low['recall@10']:.3f} already at efSearch={low['value']}, "
                   "so it suits mid-size catalogues" if low else "") + "."
                + (f" IVF-PQ's R@10 tops out at {max(r['recall@10'] for r in pq):.3f} on these vectors: for "
                   "memory-bound deployments only." if pq else ""))
    return "\n".join(out)
