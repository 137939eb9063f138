"""The query fast path, measured: micro-batching, the embedding cache, torch threads, and the
options that trade precision for speed, each with its effect on retrieval quality.

Speed (in-process, no HTTP; unique queries with the cache off unless said):
- query encodes under 1/16/64 concurrent callers: unbatched (one forward per query, as before)
  vs micro-batched (max wait 0/1/2 ms), torch threads 1 vs 2 -> queries/s, p50/p99;
- a cache hit;
- text tower fp32 / bf16 / int8 (dynamic quantisation of the Linear layers): batch 1 and 32;
- photo input 128x96 (the tower's) vs 80x60 (the catalogue photos' own size): batch 1 and 32.

Quality (kept only if it holds):
- text precision: KAGL text->photo (titles of the test split against every photo) and attribute
  queries of the test split through the engine over a full-catalogue data dir, with hybrid
  fusion on (what users get) and off (the vector ranking alone, where a query-vector change
  shows undiluted);
- photo resolution: KAGL text->photo, KAGL sub-category, and photo->photo (each test photo's
  ten nearest other photos sharing its article type), with the shipped adapter (trained at
  128x96).
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from vitrine_bench.common import Report, pct

QUALITY_TOLERANCE = 0.005  # absolute drop in a metric we still call "holds" (about the noise between runs)


def concurrent_load(fn, items: list[Any], concurrency: int, duration: float) -> dict[str, float]:
    lat: list[float] = []
    lock = threading.Lock()
    stop = time.perf_counter() + duration
    errors = [0]

    def worker(w: int) -> None:
        i = w
        mine = []
        while time.perf_counter() < stop:
            x = items[i % len(items)]
            i += concurrency
            t0 = time.perf_counter()
            try:
                fn(x)
            except Exception:  # noqa: BLE001 - a load test counts every failed request, whatever failed
                errors[0] += 1
                continue
            mine.append(time.perf_counter() - t0)
        with lock:
            lat.extend(mine)

    t0 = time.perf_counter()
    th = [threading.Thread(target=worker, args=(w,)) for w in range(concurrency)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    el = time.perf_counter() - t0
    ms = [x * 1000 for x in lat]
    return {"qps": len(lat) / el, "p50_ms": pct(ms, 50), "p99_ms": pct(ms, 99), "n": len(lat), "errors": errors[0]}


def _med(fn, min_time: float = 1.0) -> float:
    from vitrine_bench.encoders import timed

    return statistics.median(timed(fn, min_time=min_time))


# -- speed ---------------------------------------------------------------------------------------------
def batching_speed(enc: Any, texts: list[str], photos: list[bytes], duration: float, log) -> list[dict[str, Any]]:
    from vitrine.encoders.queries import QueryEncoder

    configs: list[tuple[str, dict[str, Any]]] = [
        ("unbatched", {"max_batch": 1, "max_wait_ms": 0.0}),
        ("batched, wait 0 ms", {"max_batch": 32, "max_wait_ms": 0.0}),
        ("batched, wait 1 ms", {"max_batch": 32, "max_wait_ms": 1.0}),
        ("batched, wait 2 ms", {"max_batch": 32, "max_wait_ms": 2.0}),
    ]
    rows = []
    cores = os.cpu_count() or 1
    for threads in sorted({1, cores}):
        for name, kw in configs:
            for mod, items in (("text", texts), ("photo", photos)):
                for c in (1, 16, 64):
                    if name.startswith("batched, wait 2") and c == 64:
                        continue
                    qe = QueryEncoder(enc, cache_size=0, threads=threads, **kw)
                    fn = (lambda x, qe=qe: qe.text([x])) if mod == "text" else (lambda x, qe=qe: qe.image([x]))
                    concurrent_load(fn, items, min(c, 4), 0.5)  # warm the worker
                    r = concurrent_load(fn, items, c, duration)
                    st = qe.stats()["text_batches" if mod == "text" else "image_batches"]
                    qe.close()
                    row = {"modality": mod, "config": name, "threads": threads, "clients": c, **r,
                           "mean_batch": st["mean_batch"]}
                    rows.append(row)
                    log(f"{mod:5s} {name:20s} threads={threads} clients={c:2d}: {r['qps']:7.1f} q/s "
                        f"p50={r['p50_ms']:6.1f} p99={r['p99_ms']:6.1f} ms (mean batch {st['mean_batch']:.1f})")
    return rows


def cache_hit_us(enc: Any, texts: list[str]) -> float:
    from vitrine.encoders.queries import QueryEncoder

    qe = QueryEncoder(enc, cache_size=10_000)
    qe.text(texts[:64])
    t0 = time.perf_counter()
    n = 0
    for _ in range(20):
        for t in texts[:64]:
            qe.text([t])
            n += 1
    qe.close()
    return (time.perf_counter() - t0) / n * 1e6


def precision_speed(enc: Any, texts: list[str], log) -> list[dict[str, Any]]:
    import torch

    from vitrine.encoders.queries import QueryEncoder

    rows = []
    for prec in ("fp32", "bf16", "int8"):
        qe = QueryEncoder(enc, cache_size=0, text_precision=prec)
        for bs in (1, 32):
            batch = texts[:bs]
            for threads in sorted({1, os.cpu_count() or 1}):
                torch.set_num_threads(threads)
                d = _med(lambda: qe.text_features(batch))
                rows.append({"precision": prec, "batch": bs, "threads": threads, "ms_per_batch": d * 1000,
                             "texts_per_s": bs / d})
                log(f"text {prec} batch {bs} threads {threads}: {d * 1000:.1f} ms, {bs / d:.0f} texts/s")
        qe.close()
    return rows


def runtime_speed(enc: Any, texts: list[str], photos: list[bytes], cache_dir: Path, log) -> list[dict[str, Any]]:
    """torch vs onnxruntime for each query-time model, one thread, and how far their outputs differ
    (the same vectors and probabilities, so quality is unchanged by construction; checked here)."""
    import torch

    from vitrine import onnxrt
    from vitrine.encoders.queries import QueryEncoder
    from vitrine.intent.classifier import IntentClassifier

    if not onnxrt.available():
        log("onnxruntime not installed: runtime comparison skipped")
        return []
    torch.set_num_threads(1)
    qes = {rt: QueryEncoder(enc, cache_size=0, runtime=rt, onnx_dir=cache_dir, threads=1) for rt in ("torch", "onnx")}
    # the int8 text graph (query_text_precision=auto with onnxruntime): not the same vectors, see quality
    qes["onnx int8"] = QueryEncoder(enc, cache_size=0, runtime="onnx", onnx_dir=cache_dir, threads=1,
                                    text_precision="int8")
    clfs = {rt: IntentClassifier.load(cache_dir=cache_dir / "intent", runtime=rt) for rt in ("torch", "onnx")}
    pixels = [enc.towers.preprocess(enc.decode(p)) for p in photos[:64]]
    probe_t, probe_p = texts[:200], pixels[:64]
    probe_q: list[str | None] = list(probe_t)  # the classifier's batch (None would be a photo-only query)
    ref_t = qes["torch"].text(probe_t)
    ref_p = qes["torch"]._encode_pixels(probe_p)
    ref_i = clfs["torch"].predict_batch(probe_q)
    rows = []
    for rt in ("torch", "onnx", "onnx int8"):
        qe, clf = qes[rt], clfs[rt.split()[0]]
        it = iter(range(10**9))
        cells = {
            "text tower, 1 query": lambda: qe.text_features([texts[next(it) % len(texts)]]),
            "text tower, batch of 16": lambda: qe.text_features(texts[:16]),
            "photo tower, 1 photo": lambda: qe._encode_pixels(pixels[:1]),
            "photo tower, batch of 8": lambda: qe._encode_pixels(pixels[:8]),
            "intent classifier, 1 query": lambda: clf.predict(texts[next(it) % len(texts)]),
        }
        if rt == "onnx int8":
            cells = {k: v for k, v in cells.items() if k.startswith("text")}
        diff = {
            "text tower": float(np.abs(qe.text(probe_t) - ref_t).max()),
            "photo tower": float(np.abs(np.stack(qe._encode_pixels(probe_p)) - np.stack(ref_p)).max()),
            "intent classifier": max(abs(a.scores[k] - b.scores[k]) for a, b in
                                     zip(clf.predict_batch(probe_q), ref_i) for k in a.scores),
        }
        for name, fn in cells.items():
            d = _med(fn)
            n = 16 if "16" in name else 8 if "of 8" in name else 1
            rows.append({"model": name, "runtime": rt, "ms_per_call": d * 1000, "ms_per_item": d * 1000 / n,
                         "max_abs_diff_vs_torch": diff[name.split(",")[0]]})
            log(f"{name} [{rt}]: {d * 1000:.2f} ms per call, {d * 1000 / n:.2f} per item")
        qe.close()
    return rows


def resolution_speed(photos: list[bytes], sizes: list[tuple[int, int]], log) -> list[dict[str, Any]]:
    import torch

    from vitrine.encoders.factory import create_towers
    from vitrine.encoders.images import decode_image
    from vitrine_bench.encoders import count_flops

    rows = []
    for size in sizes:
        towers = create_towers(image_size=size)
        px = torch.stack([towers.preprocess(decode_image(p)) for p in photos[:32]])
        fl = count_flops(lambda: towers.image_features(px[:1]))
        for bs in (1, 32):
            for threads in sorted({1, os.cpu_count() or 1}):
                torch.set_num_threads(threads)
                d = _med(lambda: towers.image_features(px[:bs]))
                rows.append({"input": f"{size[0]}x{size[1]}", "batch": bs, "threads": threads,
                             "ms_per_batch": d * 1000, "photos_per_s": bs / d, "mflop_per_photo": fl / 1e6})
                log(f"photo {size} batch {bs} threads {threads}: {d * 1000:.1f} ms, {bs / d:.0f}/s, {fl / 1e6:.0f} MFLOP")
    return rows


# -- quality ---------------------------------------------------------------------------------------------
def _precision_encoder(enc: Any, precision: str, runtime: str = "torch", cache_dir: Path | None = None) -> Any:
    """The encoder with its text features from the query text tower in ``precision`` (photo
    features still from the shared cache; text features never written to it)."""
    from vitrine.encoders.encoder import MultimodalEncoder
    from vitrine.encoders.queries import QueryEncoder

    qe = QueryEncoder(enc, cache_size=0, text_precision=precision, runtime=runtime, onnx_dir=cache_dir)

    class PrecisionText(MultimodalEncoder):
        def text_features(self, texts, *, progress: bool = False) -> np.ndarray:
            order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
            out = np.zeros((len(texts), self.towers.text_dim), dtype=np.float32)
            for s in range(0, len(order), 256):
                idx = order[s:s + 256]
                out[idx] = qe.text_features([texts[i] for i in idx])
            return out

    return PrecisionText(enc.towers, enc.adapter, cache=enc.cache, batch_size=enc.batch_size)


def precision_quality(data_dir: Path, n_attr: int, log) -> list[dict[str, Any]]:
    from vitrine import onnxrt
    from vitrine.evals import protocols as P
    from vitrine.evals.catalogue_queries import attribute_queries
    from vitrine.evals.datasets import Catalog, EvalQuery
    from vitrine.search.engine import Engine
    from vitrine.settings import Settings

    settings = Settings(data_dir=data_dir, _env_file=None)
    engine = Engine.open(settings)
    catalog = Catalog.load()
    present = set(engine.records.ids())
    qs = attribute_queries(settings.index.graph_dir, settings.index.taxonomy_file, "test", n_attr)
    evq = [EvalQuery(qid=q["qid"], text=q["text"], image=None,
                     relevant={i: 1.0 for i in q["relevant"] if i in present}) for q in qs]
    evq = [q for q in evq if q.relevant]
    rows = []
    # int8 has two recipes: torch's dynamic quantisation of every Linear, and onnxruntime's of every
    # MatMul but the first layer's (what query_text_precision=auto serves with onnxruntime)
    for prec, runtime in (("fp32", "torch"), ("bf16", "torch"), ("int8", "torch"), ("int8", "onnx")):
        if runtime == "onnx" and not onnxrt.available():
            continue
        row: dict[str, Any] = {"precision": prec if runtime == "torch" else f"{prec} (onnxruntime)"}
        enc = _precision_encoder(engine.encoder, prec, runtime, settings.storage.cache_dir)
        catalog._key = None  # the catalogue keeps the last encoder's features: make it ask this one
        for split in ("val", "test"):
            k = P.kagl_t2i(enc, catalog, split=split, progress=False)["metrics"]
            tag = "" if split == "test" else "_val"
            row.update({f"kagl_R@10{tag}": k["R@10"], f"kagl_MRR@10{tag}": k["MRR@10"]})
        engine.settings.encoders.query_text_precision = prec  # type: ignore[assignment]  # a str of the Literal
        engine.settings.encoders.query_runtime = runtime  # type: ignore[assignment]  # a str of the Literal
        for fusion in ("weighted", "off"):
            engine.settings.search.fusion = fusion
            engine.reader.reset_query_encoder(clear_cache=True)  # rebuilt with this precision
            m = P.run_qrels(engine, evq, [10], progress=False)["metrics"]
            row[f"attr_nDCG@10_{fusion}"] = m["nDCG@10"]
            row[f"attr_R@10_{fusion}"] = m["R@10"]
        rows.append(row)
        log(f"quality {prec}: {row}")
    engine.close()
    return rows


def resolution_quality(sizes: list[tuple[int, int]], log) -> list[dict[str, Any]]:
    from vitrine.encoders.encoder import MultimodalEncoder
    from vitrine.encoders.factory import create_towers
    from vitrine.evals import protocols as P
    from vitrine.evals.datasets import Catalog
    from vitrine.search.engine import build_encoder
    from vitrine.settings import Settings

    base = build_encoder(Settings(_env_file=None))
    catalog = Catalog.load()
    _, txt = catalog.features(base, progress=False)  # titles: cached, unchanged by the photo size
    rows = []
    for size in sizes:
        if tuple(size) == tuple(base.towers.preprocess.size):
            enc = base
        else:
            towers = create_towers(image_size=size)
            enc = MultimodalEncoder(towers, base.adapter, cache=None, batch_size=128)
        t0 = time.perf_counter()
        cat = Catalog(source=catalog.source, rows=catalog.rows, splits=catalog.splits)
        if enc is base:
            img, _ = cat.features(base, progress=False)
        else:
            img = enc.image_features([cat.photo(pid) for pid in cat.ids], progress=True)
            cat._image, cat._text, cat._key = img, txt, enc.towers.key
        secs = time.perf_counter() - t0
        k = P.kagl_t2i(enc, cat, progress=False)["metrics"]
        s = P.kagl_subcat(enc, cat, progress=False)["metrics"]
        p2p = photo_to_photo(enc, cat)
        row = {"input": f"{size[0]}x{size[1]}", "kagl_R@10": k["R@10"], "kagl_MRR@10": k["MRR@10"],
               **{f"subcat_{m}": v for m, v in s.items() if m in ("P@10", "nDCG@10", "R@10")},
               "photo2photo_P@10": p2p, "features_s": secs}
        rows.append(row)
        log(f"quality photo {size}: {row}")
    return rows


def photo_to_photo(enc: Any, cat: Any, k: int = 10) -> float:
    """Mean share of each test photo's k nearest other photos that share its article type."""
    img, _ = cat.features(enc, progress=False)
    ok = ~np.isnan(img).any(1)
    emb = enc.embed(img[ok], None).image
    types = np.array([r["articleType"] for r in cat.rows])[ok]
    q = np.flatnonzero(cat.split_mask("test")[ok])
    sims = emb[q] @ emb.T
    sims[np.arange(len(q)), q] = -np.inf
    top = np.argpartition(-sims, k, axis=1)[:, :k]
    return float((types[top] == types[q][:, None]).mean())


# -- the command -------------------------------------------------------------------------------------------
def run(data_dir: Path, out: Path, *, source: Path, duration: float, n_attr: int, skip_quality: bool,
        sizes: list[tuple[int, int]]) -> Path:
    from vitrine.search.engine import build_encoder
    from vitrine.settings import Settings
    from vitrine_bench.api import query_pool

    rep = Report("fastpath", out, "Vitrine query fast path: batching, cache, threads, precision, photo size")
    lines: list[str] = []
    load0 = os.getloadavg()

    def log(msg: str) -> None:
        print(msg, flush=True)
        lines.append(msg)

    texts, photos = query_pool(source, n=400)
    enc = build_encoder(Settings(_env_file=None))
    speed = batching_speed(enc, texts, photos[:200], duration, log)
    hit = cache_hit_us(enc, texts)
    log(f"cache hit: {hit:.1f} us")
    rt_speed = runtime_speed(enc, texts, photos, Settings(_env_file=None).storage.cache_dir, log)
    prec_speed = precision_speed(enc, texts, log)
    res_speed = resolution_speed(photos, sizes, log)
    rep.add("batching", speed)
    rep.add("cache_hit_us", hit)
    rep.add("runtime_speed", rt_speed)
    rep.add("precision_speed", prec_speed)
    rep.add("resolution_speed", res_speed)
    prec_q = res_q = None
    if not skip_quality:
        prec_q = precision_quality(data_dir, n_attr, log)
        res_q = resolution_quality(sizes, log)
        rep.add("precision_quality", prec_q)
        rep.add("resolution_quality", res_q)
    rep.add("load_avg", {"start": load0, "end": os.getloadavg()})
    rep.add("log", lines)

    rep.text(f"Encoder `{enc.model_key}` on CPU. Load average {load0[0]:.2f} at start, {os.getloadavg()[0]:.2f} at end "
             f"(2 shared cores). Each concurrency cell: {duration:.0f} s of back-to-back queries from that many "
             "threads, every query distinct to the encoder (cache off). A cache hit costs "
             f"**{hit:.0f} µs** (normalising, hashing, LRU lookup).")
    rep.table(speed, ["modality", "config", "threads", "clients", "qps", "p50_ms", "p99_ms", "mean_batch"],
              "Query encodes under concurrency (towers + adapter)")
    if rt_speed:
        rep.table(rt_speed, ["model", "runtime", "ms_per_call", "ms_per_item", "max_abs_diff_vs_torch"],
                  "Query-time models: torch vs onnxruntime (one thread, median wall time; the default runtime "
                  "is onnxruntime when installed, Settings.query_runtime)")
    rep.table(prec_speed, ["precision", "batch", "threads", "ms_per_batch", "texts_per_s"],
              "Text tower precision: speed (tokenise + MiniLM)")
    rep.table(res_speed, ["input", "batch", "threads", "ms_per_batch", "photos_per_s", "mflop_per_photo"],
              "Photo input size: speed (image tower + taps)")
    if prec_q:
        rep.table(prec_q, list(prec_q[0]), "Text tower precision: quality (KAGL on the validation split (_val) "
                  "and the test split; attribute queries on test)")
        base = prec_q[0]
        verdict = []
        for r in prec_q[1:]:
            drops = {m: base[m] - r[m] for m in base if m != "precision"}
            worst = max(drops.items(), key=lambda kv: kv[1])
            holds = worst[1] <= QUALITY_TOLERANCE
            verdict.append(f"- **{r['precision']}**: largest drop {worst[1]:+.4f} ({worst[0]}) -> "
                           f"{'holds quality' if holds else 'does NOT hold quality'}")
        rep.text("Verdict (a drop of at most "
                 f"{QUALITY_TOLERANCE} in every metric counts as holding):\n\n" + "\n".join(verdict))
    if res_q:
        rep.table(res_q, list(res_q[0]), "Photo input size: quality (shipped adapter, trained at 128x96)")
        base = res_q[0]
        verdict = []
        for r in res_q[1:]:
            drops = {m: base[m] - r[m] for m in base if m not in ("input", "features_s")}
            worst = max(drops.items(), key=lambda kv: kv[1])
            holds = worst[1] <= QUALITY_TOLERANCE
            verdict.append(f"- **{r['input']}**: largest drop {worst[1]:+.4f} ({worst[0]}) -> "
                           f"{'holds quality' if holds else 'does NOT hold quality'}")
        rep.text("Verdict:\n\n" + "\n".join(verdict))

    def draw(ax) -> None:
        for mod in ("text", "photo"):
            for name in dict.fromkeys(r["config"] for r in speed):
                pts = [r for r in speed if r["modality"] == mod and r["config"] == name
                       and r["threads"] == max(x["threads"] for x in speed)]
                if pts:
                    ax.plot([r["qps"] for r in pts], [r["p99_ms"] for r in pts], marker="o" if mod == "text" else "s",
                            label=f"{mod}: {name}")
                    for r in pts:
                        ax.annotate(str(r["clients"]), (r["qps"], r["p99_ms"]), fontsize=7)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("query encodes / s")
        ax.set_ylabel("p99 latency (ms)")
        ax.set_title("Query encoding: unbatched vs micro-batched (labels: clients)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)

    rep.plot("fastpath_batching.png", draw)
    return rep.write()
