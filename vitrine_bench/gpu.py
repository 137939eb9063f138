"""The prepared GPU benchmark: one script for a lent GPU machine, a few minutes end to end.

What it checks and measures (each part is skipped, with the reason recorded, when its
prerequisite is missing, so it also runs on a CPU-only machine):

1. environment: torch/CUDA, GPU name and memory, FAISS and its GPU count;
2. device selection: ``pick_device("auto")`` and the encoder's towers land on CUDA; a
   ``VectorIndex`` picks its FAISS GPU copy by itself (``use_gpu="auto"``) and answers like CPU;
3. matmul FLOP/s on the device (fp32, tf32, bf16) and on the CPU, as the hardware reference;
4. encoder throughput on the device: photos/s and texts/s by batch size, fp32 and bf16
   autocast, with the share of the matmul FLOP/s (FLOPs counted as in `vitrine bench encoders`);
5. the catalogue end to end on the device: every photo decoded on the CPU cores, towers +
   adapter on the GPU (products/s), giving the catalogue's vectors;
6. FAISS on the GPU over N vectors grown from those (as `vitrine bench index`): exact search
   and IVF (nprobe sweep), recall@10 and queries/s, one query at a time and batched, against
   the same on the CPU.

Without the model packages (a bare machine), give ``--inputs FILE.npz`` made here by
``vitrine bench gpu --export-inputs FILE.npz`` (catalogue vectors + real query vectors) so
the FAISS part still runs on real vectors.
"""

from __future__ import annotations

import functools
import os
import platform
import statistics
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from vitrine_bench.common import Report


def _env() -> dict[str, Any]:
    info: dict[str, Any] = {"cpu_count": os.cpu_count(), "platform": platform.platform()}
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda"] = bool(torch.cuda.is_available())
        if info["cuda"]:
            p = torch.cuda.get_device_properties(0)
            info["gpu"] = p.name
            info["gpu_memory_gib"] = round(p.total_memory / 2**30, 1)
            info["gpu_count"] = torch.cuda.device_count()
    except Exception as e:  # noqa: BLE001 - an environment report: any failure is reported, not raised
        info["torch_error"] = str(e)
    try:
        import faiss

        info["faiss"] = faiss.__version__
        info["faiss_gpus"] = int(faiss.get_num_gpus()) if hasattr(faiss, "get_num_gpus") else 0
    except Exception as e:  # noqa: BLE001 - an environment report: any failure is reported, not raised
        info["faiss_error"] = str(e)
    return info


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(fn, min_time: float = 0.5, min_reps: int = 3) -> float:
    """Median seconds per call (one warm-up call; CUDA synchronised)."""
    fn()
    _sync()
    out: list[float] = []
    t_end = time.perf_counter() + min_time
    while len(out) < min_reps or time.perf_counter() < t_end:
        t0 = time.perf_counter()
        fn()
        _sync()
        out.append(time.perf_counter() - t0)
        if len(out) >= 100:
            break
    return statistics.median(out)


def matmul(device: str) -> dict[str, float]:
    import torch

    out: dict[str, float] = {}
    n = 8192 if device == "cuda" else 2048
    for name, dtype, tf32 in (("fp32", torch.float32, False), ("tf32", torch.float32, True),
                              ("bf16", torch.bfloat16, False)):
        if device == "cpu" and name == "tf32":
            continue
        torch.backends.cuda.matmul.allow_tf32 = tf32
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        out[name] = 2 * n ** 3 / _timed(lambda: torch.mm(a, b))
    torch.backends.cuda.matmul.allow_tf32 = False
    return out


def encoders_on(device: str, source: Path, peak: dict[str, float], log) -> dict[str, Any]:
    import torch

    from vitrine.encoders.encoder import MultimodalEncoder
    from vitrine.encoders.factory import pick_device
    from vitrine.bundled import read_styles
    from vitrine_bench.encoders import count_flops

    chosen = pick_device("auto")
    enc = MultimodalEncoder.create(features_only=True, device="auto")
    res: dict[str, Any] = {"pick_device_auto": chosen, "towers_device": str(enc.towers.device)}
    rows = read_styles(source)[:1024]
    photos = [(source / "images" / f"{r['id']}.jpg").read_bytes() for r in rows[:512]]
    texts = [r["productDisplayName"] for r in rows]
    pixels = torch.stack([enc.towers.preprocess(enc.decode(p)) for p in photos])
    fl_img = count_flops(lambda: enc.towers.image_features(pixels[:1]))
    fl_txt = int(np.mean([count_flops(functools.partial(enc.towers.text_features, [t])) for t in texts[:32]]))
    res["flops_per_item"] = {"photo": fl_img, "text": fl_txt}
    table = []
    sizes = [1, 32, 128, 512] if device == "cuda" else [1, 32]
    for prec in ("fp32", "bf16"):
        ctx = (lambda: torch.autocast(device_type=device, dtype=torch.bfloat16)) if prec == "bf16" else None
        for bs in sizes:
            px = pixels[:bs].to(device)
            tx = (texts * 2)[:bs]

            def img(px=px) -> None:
                if ctx:
                    with ctx():
                        enc.towers.image_features(px)
                else:
                    enc.towers.image_features(px)

            def txt(tx=tx) -> None:
                if ctx:
                    with ctx():
                        enc.towers.text_features(tx)
                else:
                    enc.towers.text_features(tx)

            ips, tps = bs / _timed(img), bs / _timed(txt)
            ref = peak.get("bf16" if prec == "bf16" else "fp32", float("nan"))
            table.append({"precision": prec, "batch": bs, "photos_per_s": ips, "texts_per_s": tps,
                          "photo_share": ips * fl_img / ref, "text_share": tps * fl_txt / ref})
            log(f"  {device} {prec} batch {bs}: photos/s {ips:,.0f}, texts/s {tps:,.0f}")
    res["throughput"] = table
    return res


def catalogue_end_to_end(source: Path, limit: int | None, log) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Every product (photo + title) through towers + adapter on the picked device; real query
    vectors (attribute queries + test titles) through the query path."""
    from vitrine.encoders.queries import QueryEncoder
    from vitrine.bundled import read_styles
    from vitrine.search.engine import build_encoder
    from vitrine.settings import Settings
    from vitrine_bench.api import query_pool

    settings = Settings(_env_file=None, encode_batch_size=256)
    enc = build_encoder(settings)
    enc.cache = None  # measure the towers, not the feature cache
    rows = read_styles(source)[:limit] if limit else read_styles(source)
    t0 = time.perf_counter()
    photos = [(source / "images" / f"{r['id']}.jpg").read_bytes() for r in rows]
    t_read = time.perf_counter() - t0
    t0 = time.perf_counter()
    imf = enc.image_features(photos)
    tf = enc.text_features([r["productDisplayName"] for r in rows])
    emb = enc.embed(imf, tf)
    _sync()
    secs = time.perf_counter() - t0
    texts, _ = query_pool(source, n=1000)
    qe = QueryEncoder(enc, cache_size=0, max_batch=256, max_wait_ms=0)
    queries = np.concatenate([qe.text(texts[i:i + 256]) for i in range(0, len(texts), 256)])
    qe.close()
    info = {"products": len(rows), "device": str(enc.towers.device), "seconds": secs,
            "products_per_s": len(rows) / secs, "read_s": t_read}
    log(f"  catalogue: {len(rows):,} products in {secs:.1f}s = {len(rows) / secs:,.0f}/s on {enc.towers.device}")
    return emb.fused, queries, info


def faiss_gpu(base: np.ndarray, queries: np.ndarray, n_large: int, log) -> dict[str, Any]:
    import faiss

    from vitrine.index.vectors import VectorIndex
    from vitrine_bench.index import exact_topk, recall_at_k, synthesize, time_batch, time_single

    out: dict[str, Any] = {}
    ngpu = int(faiss.get_num_gpus()) if hasattr(faiss, "get_num_gpus") else 0
    # VectorIndex picks the GPU by itself and answers like the CPU
    vi_auto = VectorIndex(base.shape[1], "Flat")
    vi_cpu = VectorIndex(base.shape[1], "Flat", use_gpu="never")
    ids = np.arange(len(base))
    vi_auto.upsert(ids, base)
    vi_cpu.upsert(ids, base)
    _, a = vi_auto.search(queries[:200], 10)
    _, c = vi_cpu.search(queries[:200], 10)
    out["vectorindex_auto_on_gpu"] = vi_auto.on_gpu
    out["vectorindex_gpu_matches_cpu_recall"] = recall_at_k(a, c)
    log(f"  VectorIndex(use_gpu=auto) on GPU: {vi_auto.on_gpu}; agreement with CPU: "
        f"{out['vectorindex_gpu_matches_cpu_recall']:.4f}")
    del vi_auto, vi_cpu
    if ngpu == 0:
        out["skipped"] = "FAISS has no GPU here (faiss-cpu, or no CUDA device): pip install faiss-gpu-cu12"
        return out
    big = synthesize(base, n_large)
    gt = exact_topk(big, queries)
    res = faiss.StandardGpuResources()
    rows = []
    d = big.shape[1]
    makers = {
        "Flat": lambda: faiss.GpuIndexFlatIP(res, d),
        "IVF4096,Flat": lambda: faiss.GpuIndexIVFFlat(  # type: ignore[attr-defined]  # in GPU builds of faiss only
            res, d, 4096, faiss.METRIC_INNER_PRODUCT),
        "IVF4096,PQ32": lambda: faiss.GpuIndexIVFPQ(res, d, 4096, 32, 8, faiss.METRIC_INNER_PRODUCT),
    }
    params = faiss.GpuParameterSpace()
    for factory, values in (("Flat", [None]), ("IVF4096,Flat", [1, 4, 8, 16, 32, 64, 128]),
                            ("IVF4096,PQ32", [8, 16, 32, 64])):
        t0 = time.perf_counter()
        gpu = makers[factory]()
        if not gpu.is_trained:
            rng = np.random.default_rng(0)
            gpu.train(np.ascontiguousarray(big[rng.choice(len(big), 64 * 4096, replace=False)]))
        gpu.add(big)
        build = time.perf_counter() - t0
        for v in values:
            if v is not None:
                params.set_index_parameter(gpu, "nprobe", v)
            q1, _ = time_single(lambda q, g=gpu: g.search(q, 10), queries, 3.0, len(queries))
            qb, (_, found) = time_batch(lambda q, g=gpu: g.search(q, 10), queries)
            rows.append({"factory": factory, "nprobe": v, "recall@10": recall_at_k(found, gt),
                         "qps_single": q1, "qps_batch": qb, "build_s": build})
            log(f"  GPU {factory} nprobe={v}: R@10 {rows[-1]['recall@10']:.3f} single {q1:,.0f}/s batch {qb:,.0f}/s")
        del gpu
    out["rows"] = rows
    cpu_flat = faiss.IndexFlatIP(big.shape[1])
    cpu_flat.add(big)
    q1, _ = time_single(lambda q: cpu_flat.search(q, 10), queries, 3.0, 50)
    qb, _ = time_batch(lambda q: cpu_flat.search(q, 10), queries, reps=1)
    out["cpu_exact"] = {"qps_single": q1, "qps_batch": qb}
    out["n"] = len(big)
    return out


def export_inputs(path: Path, source: Path) -> Path:
    base, queries, _ = catalogue_end_to_end(source, None, print)
    np.savez_compressed(path, base=base.astype(np.float32), queries=queries.astype(np.float32))
    return path


def run(out: Path, *, source: Path, n_large: int, inputs: Path | None, cpu_limit: int) -> Path:
    rep = Report("gpu", out, "Vitrine on a GPU: device selection, encoders, FAISS")
    lines: list[str] = []

    def log(msg: str) -> None:
        print(msg, flush=True)
        lines.append(msg)

    env = _env()
    rep.add("environment", env)
    cuda = bool(env.get("cuda"))
    log(f"environment: {env}")
    parts: dict[str, Any] = {}
    skipped: dict[str, str] = {}

    def part(name: str, fn) -> Any:
        t0 = time.perf_counter()
        try:
            r = fn()
            parts[name] = r
            log(f"[{name}] done in {time.perf_counter() - t0:.1f}s")
            return r
        except Exception as e:  # noqa: BLE001 - one failing part must not lose the others' results
            skipped[name] = f"{type(e).__name__}: {e}"
            log(f"[{name}] skipped: {skipped[name]}")
            parts[name + "_traceback"] = traceback.format_exc()[-3000:]
            return None

    dev = "cuda" if cuda else "cpu"
    peak = part("matmul", lambda: {"device": matmul(dev) if cuda else {}, "cpu": matmul("cpu")}) or {}
    if not cuda:
        skipped["device"] = "no CUDA device: torch.cuda.is_available() is False; GPU parts skipped"
    part("encoders", lambda: encoders_on(dev, source, (peak.get("device") or peak.get("cpu") or {}), log))
    base = queries = None
    if inputs is not None:
        z = np.load(inputs)
        base, queries = z["base"], z["queries"]
        log(f"inputs from {inputs}: {base.shape[0]:,} catalogue vectors, {queries.shape[0]} queries")
    else:
        r = part("catalogue", lambda: catalogue_end_to_end(source, None if cuda else cpu_limit, log))
        if r is not None:
            base, queries, info = r
            parts["catalogue"] = info
    if base is not None:
        part("faiss", lambda: faiss_gpu(np.ascontiguousarray(base, dtype=np.float32),
                                        np.ascontiguousarray(queries, dtype=np.float32), n_large if cuda else
                                        min(n_large, 100_000), log))
    else:
        skipped["faiss"] = "no catalogue vectors (encoder unavailable and no --inputs)"
    rep.add("parts", parts)
    rep.add("skipped", skipped)
    rep.add("log", lines)
    rep.text(f"Environment: `{env}`.\n\n" + ("**No CUDA device here**: the GPU parts were skipped and the CPU "
                                              "fallbacks ran at reduced size; rerun on a GPU machine.\n\n"
                                              if not cuda else ""))
    if skipped:
        rep.text("Skipped:\n\n" + "\n".join(f"- {k}: {v}" for k, v in skipped.items()))
    if "matmul" in parts:
        rep.text("Matmul FLOP/s: " + "; ".join(f"{where} {k} {v / 1e12:.2f} TFLOP/s"
                                               for where, d in parts["matmul"].items() for k, v in d.items()))
    if "encoders" in parts:
        e = parts["encoders"]
        rep.text(f"`pick_device('auto')` = `{e['pick_device_auto']}`, towers on `{e['towers_device']}`.")
        rep.table(e["throughput"], ["precision", "batch", "photos_per_s", "texts_per_s", "photo_share",
                                    "text_share"], "Encoder towers on the device")
    if "catalogue" in parts:
        c = parts["catalogue"]
        rep.text(f"Catalogue end to end (decode on {os.cpu_count()} CPU cores, towers + adapter on "
                 f"`{c['device']}`): {c['products']:,} products in {c['seconds']:.1f}s = "
                 f"**{c['products_per_s']:,.0f} products/s**.")
    if "faiss" in parts:
        f = parts["faiss"]
        rep.text(f"`VectorIndex(use_gpu='auto')` on the GPU: **{f.get('vectorindex_auto_on_gpu')}** (agreement "
                 f"with the CPU index: {f.get('vectorindex_gpu_matches_cpu_recall', float('nan')):.4f}).")
        if f.get("skipped"):
            rep.text(f"FAISS GPU part skipped: {f['skipped']}.")
        if f.get("rows"):
            rep.table(f["rows"], ["factory", "nprobe", "recall@10", "qps_single", "qps_batch", "build_s"],
                      f"FAISS on the GPU, {f['n']:,} vectors grown from the catalogue")
            rep.text(f"CPU exact search on the same vectors: {f['cpu_exact']['qps_single']:,.1f} q/s single, "
                     f"{f['cpu_exact']['qps_batch']:,.0f} q/s batched.")
    return rep.write()
