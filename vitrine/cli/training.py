"""Training glue: bundled catalogue -> cached backbone features -> adapter -> shipped weights."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vitrine.cli.train import DEFAULT_VIEW_PROB, DEFAULT_VIEWS
from vitrine.encoders.adapters import WEIGHTS_DIR, Adapter, create_adapter
from vitrine.encoders.encoder import MultimodalEncoder
from vitrine.encoders.train import PairSet, TrainConfig, seed_everything, train_adapter
from vitrine.evals import attribute_queries as aq
from vitrine.evals.datasets import Catalog
from vitrine.evals.metrics import mean_metrics
from vitrine.search.settings import Settings

log = logging.getLogger("vitrine.train")


def features_encoder(settings: Settings) -> MultimodalEncoder:
    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    return MultimodalEncoder.create(
        settings.model, None, features_only=True, pretrained=settings.pretrained, device=settings.device,
        image_size=settings.image_size, cache_path=settings.feature_cache_path,
        batch_size=settings.encode_batch_size,
    )


def hard_negative_rows(rows: list[dict[str, str]], subset: np.ndarray, per_row: int = 4,
                       seed: int = 0) -> np.ndarray:
    """For each row of ``subset``: rows of the same article type but another colour or gender."""
    rng = np.random.default_rng(seed)
    by_type: dict[str, list[int]] = {}
    for j, r in enumerate(subset):
        by_type.setdefault(rows[r]["articleType"], []).append(j)
    out = np.full((len(subset), per_row), -1, dtype=np.int64)
    for j, r in enumerate(subset):
        same = by_type[rows[r]["articleType"]]
        if len(same) < 2:
            continue
        cand = rng.choice(same, size=min(len(same), 4 * per_row), replace=False)
        picked = [c for c in cand if rows[subset[c]]["baseColour"] != rows[r]["baseColour"]
                  or rows[subset[c]]["gender"] != rows[r]["gender"]][:per_row]
        out[j, : len(picked)] = picked
    return out


def build_pairs(catalog: Catalog, encoder: MultimodalEncoder, split: str, *, queries: bool, seed: int,
                progress: bool = True, views: tuple[str, ...] = ()) -> tuple[PairSet, np.ndarray]:
    img_f, txt_f = catalog.features(encoder, progress=progress)
    rows_idx = np.flatnonzero(catalog.split_mask(split))
    groups = catalog.title_groups()[rows_idx]
    image_views = None
    if views:
        log.info("augmented photo views %s of %d photos (cached after the first run)", ",".join(views), len(rows_idx))
        image_views = catalog.view_features(encoder, views, rows_idx, progress=progress)
    ps = PairSet(image=img_f[rows_idx], text=txt_f[rows_idx], group=groups, image_views=image_views)
    if queries:
        local = {int(r): j for j, r in enumerate(rows_idx)}
        pq = aq.pseudo_queries(catalog.rows, rows_idx.tolist(), per_product=3, seed=seed)
        key_ids: dict[str, int] = {}
        pkeys = np.full((len(aq.SUBSETS), len(rows_idx)), -1, dtype=np.int64)
        for j, r in enumerate(rows_idx):
            attrs = aq.attrs_of(catalog.rows[r])
            for s, sub in enumerate(aq.SUBSETS):
                if aq.usable(sub, attrs):
                    pkeys[s, j] = key_ids.setdefault(f"{s}:{aq.subset_key(sub, attrs)}", len(key_ids))
        ps.query_rows = np.array([local[q.row] for q in pq], dtype=np.int64)
        ps.query_subset = np.array([q.subset for q in pq], dtype=np.int64)
        ps.query_key = np.array([key_ids[f"{q.subset}:{q.key}"] for q in pq], dtype=np.int64)
        ps.query_text = encoder.text_features([q.text for q in pq], progress=progress)
        ps.product_keys = pkeys
        ps.hard_negatives = hard_negative_rows(catalog.rows, rows_idx, seed=seed)
    return ps, rows_idx


@torch.inference_mode()
def tune_fuse_weight(adapter: Adapter, catalog: Catalog, encoder: MultimodalEncoder, split: str = "val",
                     grid: tuple[float, ...] = (0.0, 0.1, 0.2, 0.35, 0.5, 0.65, 0.8)) -> dict[str, Any]:
    """Pick the photo weight of the fused product vector on ``split``: attribute-query nDCG@10
    and title->product MRR@10 over that split's products, averaged."""
    img_f, txt_f = catalog.features(encoder, progress=False)
    rows_idx = np.flatnonzero(catalog.split_mask(split))
    out = adapter(torch.from_numpy(img_f[rows_idx]), torch.from_numpy(txt_f[rows_idx]))
    sub_rows = [catalog.rows[r] for r in rows_idx]
    qs = aq.eval_queries(sub_rows, list(range(len(sub_rows))), n=300, seed=7)
    qv = adapter(None, torch.from_numpy(encoder.text_features([q["text"] for q in qs]))).text
    groups = catalog.title_groups()[rows_idx]
    members: dict[int, dict[int, float]] = {}
    for j, g in enumerate(groups):
        members.setdefault(int(g), {})[j] = 1.0
    id_pos = {r["id"]: j for j, r in enumerate(sub_rows)}
    results = {}
    for w in grid:
        fused = torch.nn.functional.normalize(w * out.image + (1 - w) * out.text, dim=-1)
        top_q = (qv @ fused.T).topk(10, dim=1).indices.tolist()
        runs_q = [(t, {id_pos[p]: 1.0 for p in q["relevant"]}) for t, q in zip(top_q, qs)]
        top_t = (out.text @ fused.T).topk(10, dim=1).indices.tolist()
        runs_t = [(t, members[int(g)]) for t, g in zip(top_t, groups)]
        m = mean_metrics(runs_q, [10], ("nDCG",))["nDCG@10"]
        t = mean_metrics(runs_t, [10], ("MRR",))["MRR@10"]
        results[w] = {"attr_nDCG@10": m, "title_MRR@10": t, "score": (m + t) / 2}
    best = max(results, key=lambda w: results[w]["score"])
    return {"best": best, "grid": results}


def train_gate_command(settings: Settings, *, kind: str, out: Path | None, source: Path | None, epochs: int,
                       batch_size: int, lr: float, dim: int, hidden: int, experts: int, top_k: int,
                       dynamic_k: bool, queries: bool, seed: int, patience: int,
                       name: str | None, balance_weight: float = 0.05, balance: str = "bias",
                       bias_rate: float = 0.01, overrides: dict[str, Any] | None = None,
                       ema_decay: float = 0.0, views: tuple[str, ...] = DEFAULT_VIEWS,
                       view_prob: float = DEFAULT_VIEW_PROB) -> dict[str, Any]:
    t0 = time.time()
    seed_everything(seed)
    encoder = features_encoder(settings)
    catalog = Catalog.load(source)
    log.info("computing backbone features for %d products (cached after the first run)", len(catalog.rows))
    use_queries = queries and kind in ("mlp", "moe")
    train, _ = build_pairs(catalog, encoder, "train", queries=use_queries, seed=seed, views=views)
    val, _ = build_pairs(catalog, encoder, "val", queries=False, seed=seed)
    cfg_adapter: dict[str, Any] = {
        "image_dim": encoder.towers.image_dim, "text_dim": encoder.towers.text_dim, "dim": dim,
        "hidden": hidden, "towers_key": encoder.towers.key, "model": settings.model,
        "name": name or kind,
    }
    if kind == "moe":
        cfg_adapter |= {"experts": experts, "top_k": top_k, "dynamic_k": dynamic_k, "balance_weight": balance_weight,
                        "balance": balance, "bias_rate": bias_rate}
    cfg_adapter |= overrides or {}
    adapter = create_adapter(kind, **cfg_adapter)
    out = Path(out) if out else WEIGHTS_DIR / (name or kind)
    out.mkdir(parents=True, exist_ok=True)
    tcfg = TrainConfig(epochs=epochs, batch_size=batch_size, lr=lr, seed=seed, patience=patience,
                       modality_dropout=0.15 if kind == "moe" else 0.0,
                       text_text_weight=0.5 if kind == "moe" else 0.0, ema_decay=ema_decay, view_prob=view_prob)
    result = train_adapter(adapter, train, val, tcfg, progress=True, log_path=out / "train_log.jsonl")
    if kind == "moe":  # its modality gate weighs photo and text per product: nothing to tune
        tuning = {"best": None, "grid": {}}
    else:
        tuning = tune_fuse_weight(adapter, catalog, encoder)
        adapter.config["fuse_image_weight"] = tuning["best"]
        adapter.config["fuse_tuning"] = {str(k): v for k, v in tuning["grid"].items()}
    summary: dict[str, Any] = {
        "kind": kind, "out": _display_path(out), "best_epoch": result.best_epoch, "val_MRR@10": result.best_score,
        "val": result.history[result.best_epoch] if result.best_epoch >= 0 else {},
        "fuse_image_weight": tuning["best"], "train_pairs": len(train.image),
        "pseudo_queries": int(len(train.query_rows)) if train.query_rows is not None else 0,
        "photo_views": list(views), "view_prob": view_prob if views else 0.0,
        "seconds": round(time.time() - t0, 1),
    }
    if hasattr(adapter, "routing_stats"):
        with torch.inference_mode():
            summary["routing"] = adapter.routing_stats(torch.from_numpy(val.image), torch.from_numpy(val.text),
                                                       pairs=True)
    adapter.save_pretrained(out)
    (out / "train_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _display_path(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(p)


def train_intent_command(**kwargs: Any) -> dict[str, Any]:
    from vitrine.intent.training import train_intent  # noqa: PLC0415 - optional extra

    kwargs.setdefault("cache_dir", Settings().cache_dir / "intent")  # the converted Qwen tokenizer's cache
    return train_intent(**kwargs)
