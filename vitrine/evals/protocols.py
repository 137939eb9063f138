"""Evaluation protocols on the bundled catalogue and on qrels files.

- ``kagl-t2i``: the text-to-image protocol of Marqo's public fashion leaderboard (KAGL) on our
  catalogue: queries = titles of every test-split product, gallery = every product's photo,
  relevant = every product with an identical title. R@k is BEIR's recall (share of the
  relevant items found in the top k), MRR@10 the reciprocal rank of the first relevant one.
- ``kagl-subcat``: each subCategory name as a query; product vector =
  normalise(0.9 * photo + 0.1 * title); relevant = products of that subCategory.
- ``photo-self``: each test photo searched through the engine must find its own product (or
  one with a byte-identical photo) at rank 1.
- ``qrels``: any JSONL of queries with graded relevance, run through ``Engine.search``.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from vitrine.encoders.encoder import MultimodalEncoder
from vitrine.encoders.moe import CrossModalMoE
from vitrine.errors import ModelError
from vitrine.evals.datasets import Catalog, EvalQuery
from vitrine.metrics import mean_metrics, totals_within
from vitrine.progress import progress_bar
from vitrine.search.engine import Engine
from vitrine.search.models import Filters, SearchRequest

log = logging.getLogger(__name__)


def _topk(queries: np.ndarray, gallery: np.ndarray, k: int) -> np.ndarray:
    """Exact top-k gallery rows per query (inner product), in chunks."""
    out = []
    g = torch.from_numpy(np.ascontiguousarray(gallery))
    for s in range(0, len(queries), 1024):
        q = torch.from_numpy(np.ascontiguousarray(queries[s:s + 1024]))
        out.append((q @ g.T).topk(min(k, len(gallery)), dim=1).indices.numpy())
    return np.concatenate(out) if out else np.zeros((0, k), dtype=np.int64)


def kagl_t2i(encoder: MultimodalEncoder, catalog: Catalog, *, split: str = "test", k: int = 10,
             progress: bool = True) -> dict[str, Any]:
    img_f, txt_f = catalog.features(encoder, progress=progress)
    groups = catalog.title_groups()
    qmask = catalog.split_mask(split)
    has_img = ~np.isnan(img_f).any(1)
    gallery = encoder.embed(img_f[has_img], None).image
    gallery_rows = np.flatnonzero(has_img)
    queries = encoder.embed(None, txt_f[qmask]).text
    top = gallery_rows[_topk(queries, gallery, k)]  # type: ignore[arg-type]  # embed() with text gives .text
    qgroups = groups[qmask]
    members: dict[int, list[int]] = {}
    for row, g in enumerate(groups):
        if has_img[row]:
            members.setdefault(int(g), []).append(row)
    runs = [(list(t), {r: 1.0 for r in members.get(int(g), [])}) for t, g in zip(top, qgroups)]
    m = mean_metrics(runs, [1, 5, 10], ("R", "MRR", "Hit", "nDCG"))
    metrics = {key: m[key] for key in ("R@1", "R@5", "R@10", "MRR@10", "Hit@1", "Hit@10", "nDCG@10")}
    return {"protocol": "kagl-t2i", "split": split, "queries": int(qmask.sum()), "gallery": int(has_img.sum()),
            "metrics": metrics}


def routing_report(encoder: MultimodalEncoder, catalog: Catalog, *, split: str = "test",
                   progress: bool = True) -> dict[str, Any]:
    """The gate's routing statistics on a split's products (photo and title each routed alone, as
    indexed and queried; products without a photo are left out), for ``vitrine eval``."""
    adapter = encoder.adapter
    if not isinstance(adapter, CrossModalMoE):
        raise ModelError("routing statistics need an adapter with a router (the MoE gate)")
    img_f, txt_f = catalog.features(encoder, progress=progress)
    rows = np.flatnonzero(catalog.split_mask(split) & ~np.isnan(img_f).any(1))
    stats = adapter.routing_stats(torch.from_numpy(img_f[rows]), torch.from_numpy(txt_f[rows]), pairs=True)
    return {"split": split, "products": len(rows), **stats}


def kagl_subcat(encoder: MultimodalEncoder, catalog: Catalog, *, k: int = 10, photo_weight: float = 0.9,
                progress: bool = True) -> dict[str, Any]:
    img_f, txt_f = catalog.features(encoder, progress=progress)
    emb = encoder.embed(img_f, txt_f)
    prod = photo_weight * emb.image + (1 - photo_weight) * emb.text  # type: ignore[operator]  # embed() with both gives both
    prod /= np.linalg.norm(prod, axis=1, keepdims=True).clip(1e-12)
    subcats = [r["subCategory"] for r in catalog.rows]
    names = sorted(set(subcats))
    q = encoder.embed(None, encoder.text_features(names)).text
    top = _topk(q, prod, k)  # type: ignore[arg-type]  # embed() with text gives .text
    by_cat: dict[str, dict[int, float]] = {}
    for row, c in enumerate(subcats):
        by_cat.setdefault(c, {})[row] = 1.0
    runs = [(list(t), by_cat[n]) for t, n in zip(top, names)]
    m = mean_metrics(runs, [1, 10], ("P", "MRR", "nDCG"))
    metrics = {"P@1": m["P@1"], "P@10": m["P@10"], "MRR@10": m["MRR@10"], "nDCG@10": m["nDCG@10"]}
    return {"protocol": "kagl-subcat", "queries": len(names), "gallery": len(prod), "photo_weight": photo_weight,
            "metrics": metrics}


def photo_self(engine: Engine, catalog: Catalog, *, split: str = "test", limit: int | None = None,
               progress: bool = True) -> dict[str, Any]:
    """Each photo of ``split`` (that the engine holds) searched by itself through the engine."""
    present = set(engine.records.get_many(catalog.ids))
    ids = [pid for pid, m in zip(catalog.ids, catalog.split_mask(split)) if m and pid in present]
    if limit:
        ids = ids[:limit]
    digest = {pid: hashlib.sha256(catalog.photo(pid)).hexdigest() for pid in catalog.ids if pid in present}
    ok = 0
    misses: list[dict[str, str]] = []
    lat = []
    for pid in progress_bar(ids, desc="photo-self", enabled=progress):
        t0 = time.perf_counter()
        res = engine.search(SearchRequest(k=1), image=catalog.photo(pid))
        lat.append((time.perf_counter() - t0) * 1000)
        top = res.results[0].id if res.results else None
        if top == pid or (top is not None and digest.get(top) == digest[pid]):
            ok += 1
        elif len(misses) < 20:
            misses.append({"query": pid, "top": str(top)})
    n = len(ids)
    return {"protocol": "photo-self", "split": split, "queries": n,
            "metrics": {"self@1": ok / n if n else 0.0},
            "latency_ms": {"p50": float(np.percentile(lat, 50)) if lat else None,
                           "p99": float(np.percentile(lat, 99)) if lat else None},
            "misses": misses}


def run_qrels(engine: Engine, queries: Sequence[EvalQuery], ks: Sequence[int], *, progress: bool = True,
              filters_key: str = "filters", gain: str = "exponential") -> dict[str, Any]:
    """Run each query through the engine and score its ranking against the qrels (``gain``:
    nDCG's gain for graded qrels, vitrine/metrics.py), and how well each search's ``total``
    holds the relevant products of its top ``max(ks)`` (``totals``: metrics.totals_within)."""
    kmax = max(ks)
    runs = []
    totals: list[int] = []  # each search's ``total``: how well it holds the relevant (metrics.totals_within)
    lat = []
    for q in progress_bar(queries, desc="eval", enabled=progress):
        flt = q.meta.get(filters_key)
        req = SearchRequest(text=q.text, k=kmax, filters=Filters.model_validate(flt) if flt else None)
        t0 = time.perf_counter()
        res = engine.search(req, image=q.image)
        lat.append((time.perf_counter() - t0) * 1000)
        runs.append(([h.id for h in res.results], q.relevant))
        totals.append(res.total or 0)
    metrics = mean_metrics(runs, ks, ("R", "P", "MRR", "nDCG"), gain)
    within = totals_within([(r, rel, t) for (r, rel), t in zip(runs, totals)], kmax)
    return {"protocol": "qrels", "queries": len(queries), "gain": gain, "metrics": metrics,
            "totals": {"depth": kmax, **{k: round(v, 4) for k, v in within.items()}},
            "latency_ms": {"p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99))}}
