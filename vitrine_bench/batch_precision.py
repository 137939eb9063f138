"""The towers' batch precision (vitrine/encoders/precision.py), float32 vs bf16 autocast, in turn:

- the towers alone on a catalogue's texts (sorted by tokens, forwards of 64, as ingest runs them) and
  on bundled photos (decoded beforehand), texts/s and photos/s per precision, alternated;
- how far bf16's features are from float32's: cosines of the towers' features and of the served
  shared-space vectors (through the shipped adapter) for the same texts and photos;
- the whole ``vitrine ingest`` command, text-only, cold feature cache, tuning off, wall clock from
  start to exit (model loading included), each precision in its own process, alternated.

Retrieval quality per precision is measured with the eval CLI (bench-results/batch-precision-quality.md).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from vitrine_bench.common import Report
from vitrine_bench.encoders import matmul_flops

PRECISIONS = ("fp32", "bf16")


def cosines(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    c = np.einsum("ij,ij->i", a, b) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)
    return {"min": float(c.min()), "p1": float(np.percentile(c, 1)), "mean": float(c.mean())}


def _present(vectors: np.ndarray | None) -> np.ndarray:
    if vectors is None:
        raise RuntimeError("the adapter gave no photo vectors")
    return vectors


def towers(catalogue: Path, photos_dir: Path, *, n_text: int, n_photo: int, rounds: int) -> dict[str, Any]:
    """Texts/s and photos/s of the towers per precision (median of ``rounds``, alternated) and the
    cosines between the two precisions' features."""
    import torch

    from vitrine.encoders.encoder import MultimodalEncoder
    from vitrine.encoders.precision import bf16_speedup
    from vitrine.search.engine import build_encoder
    from vitrine.search.models import Product, product_text
    from vitrine.settings import Settings

    base = build_encoder(Settings())  # the served towers and adapter, for the shared-space vectors
    encs = {p: MultimodalEncoder(base.towers, base.adapter, cache=None, batch_precision=p) for p in PRECISIONS}
    recs = [json.loads(x) for x in catalogue.read_text().splitlines()[:n_text]]
    texts = [product_text(Product.model_validate({k: v for k, v in r.items() if k != "image"})) for r in recs]
    blobs = [p.read_bytes() for p in sorted(photos_dir.glob("*.jpg"))[:n_photo]]
    px = torch.stack([base.towers.preprocess(base.decode(b)) for b in blobs])
    rates: dict[str, list[float]] = {f"{k}_{p}": [] for p in PRECISIONS for k in ("texts_per_s", "photos_per_s")}
    feats: dict[str, dict[str, np.ndarray]] = {}
    for p, enc in encs.items():  # warm: kernels picked, caches filled
        enc.text_features(texts[:64])
        enc.pixel_features(px[:8], precision=p)
    for _ in range(rounds):
        for p, enc in encs.items():
            t0 = time.perf_counter()
            tf = enc.text_features(texts)
            rates[f"texts_per_s_{p}"].append(len(texts) / (time.perf_counter() - t0))
            t0 = time.perf_counter()
            pf = enc.pixel_features(px, precision=p)
            rates[f"photos_per_s_{p}"].append(len(blobs) / (time.perf_counter() - t0))
            feats[p] = {"text": tf, "photo": pf}
    out: dict[str, Any] = {k: statistics.median(v) for k, v in rates.items()}
    out["runs"] = rates
    out["bf16_matmul_speedup"] = bf16_speedup("cpu")
    out["n_text"], out["n_photo"] = len(texts), len(blobs)
    a, b = feats["fp32"], feats["bf16"]
    shared = {p: _present(encs[p].embed(feats[p]["photo"], None).image) for p in PRECISIONS}
    fused = {p: encs[p].embed(None, encs[p].shared_text_features(texts, native=feats[p]["text"])).fused
             for p in PRECISIONS}
    out["cosines"] = {"text tower": cosines(a["text"], b["text"]), "photo tower": cosines(a["photo"], b["photo"]),
                      "shared space, texts": cosines(fused["fp32"], fused["bf16"]),
                      "shared space, photos": cosines(shared["fp32"], shared["bf16"])}
    return out


def ingest_wall(catalogue: Path, precision: str, jobs: int) -> dict[str, Any]:
    """One ``vitrine ingest`` of ``catalogue`` (text-only) in a fresh data dir and feature cache."""
    work = Path(tempfile.mkdtemp(prefix="vitrine-bp-"))
    env = {**os.environ, "VITRINE_TUNE_AFTER_INGEST": "false", "VITRINE_CACHE_DIR": str(work / "cache"),
           "VITRINE_BATCH_PRECISION": precision}
    cmd = [sys.executable, "-m", "vitrine.cli.__main__", "ingest", str(catalogue), "--data", str(work / "data"),
           "--jobs", str(jobs)]
    try:
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"vitrine ingest failed: {proc.stderr[-2000:]}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    n = sum(1 for line in catalogue.read_text().splitlines() if line.strip())
    return {"precision": precision, "products": n, "seconds": wall, "products_per_s": n / wall}


def run(out: Path, *, catalogue: Path, photos_dir: Path, n_text: int = 2000, n_photo: int = 256, rounds: int = 3,
        ingest_rounds: int = 2, jobs: int = 2) -> Path:
    import torch

    rep = Report("batch-precision", out, "Vitrine batch encodes: float32 vs bf16 autocast")
    flops_before = matmul_flops(1) / 1e9  # (sets torch's threads to one)
    torch.set_num_threads(jobs)
    tw = towers(catalogue, photos_dir, n_text=n_text, n_photo=n_photo, rounds=rounds)
    ingests = [ingest_wall(catalogue, p, jobs) for _ in range(ingest_rounds) for p in PRECISIONS]
    flops_after = matmul_flops(1) / 1e9
    rep.add("towers", tw)
    rep.add("ingest", ingests)
    rep.add("gflops_per_core", [flops_before, flops_after])
    rep.text(f"Catalogue: `{catalogue}` ({ingests[0]['products']} products, text-only); photos: {tw['n_photo']} "
             f"of `{photos_dir}`. fp32 matmul {flops_before:.0f} / {flops_after:.0f} GFLOP/s per core before / "
             f"after; bf16 matrix products {tw['bf16_matmul_speedup']:.2f}x float32's here "
             f"(`auto` picks bf16 at >= 1.3x). Command: `vitrine bench batch-precision --catalog {catalogue}`.")
    rep.table([{"precision": p, "texts_per_s": tw[f"texts_per_s_{p}"], "photos_per_s": tw[f"photos_per_s_{p}"]}
               for p in PRECISIONS], ["precision", "texts_per_s", "photos_per_s"],
              heading=f"The towers alone (median of {rounds} alternated rounds; {jobs} threads)")
    rep.table([{"features": k, **{f"cos_{s}": v for s, v in c.items()}} for k, c in tw["cosines"].items()],
              ["features", "cos_min", "cos_p1", "cos_mean"],
              heading="bf16 vs float32 features of the same items (cosine per item)")
    rep.table(ingests, ["precision", "products", "seconds", "products_per_s"],
              heading="`vitrine ingest` text-only, whole command (model loading included), cold cache, tuning off, "
                      f"--jobs {jobs}, alternated")

    def draw(ax: Any) -> None:
        for i, p in enumerate(PRECISIONS):
            vals = [r["products_per_s"] for r in ingests if r["precision"] == p]
            ax.bar(i, statistics.median(vals), label=p)
            ax.scatter([i] * len(vals), vals, color="black", s=12, zorder=3)
        ax.set_xticks(range(len(PRECISIONS)), PRECISIONS)
        ax.set_ylabel("products/s, whole `vitrine ingest` command")
        ax.set_title("Text-only ingest by batch precision")

    rep.plot("batch-precision.png", draw)
    return rep.write()
