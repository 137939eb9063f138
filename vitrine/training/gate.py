"""Training the aligner (the MoE gate, or the MLP / linear heads) on a catalogue folder: the
bundled one by default, the shipped weights' run (``vitrine train gate``; docs/models.md).

recipe -> cached backbone features -> pairs (vitrine/training/pairs.py) -> the training loop
(vitrine/training/adapter.py) -> config.json + model.safetensors + recipe.json + the training
log and summary in the output folder. Heavy imports (torch, the towers) happen inside the
functions.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitrine.training.recipe import GateRecipe, save_recipe

if TYPE_CHECKING:  # pragma: no cover
    from vitrine.encoders.adapter_base import Adapter
    from vitrine.encoders.encoder import MultimodalEncoder
    from vitrine.evals.datasets import Catalog
    from vitrine.settings import Settings
    from vitrine.training.adapter import TrainResult
    from vitrine.training.lora import JointTowers
    from vitrine.training.pairs import PairSet

log = logging.getLogger(__name__)


def features_encoder(settings: Settings) -> MultimodalEncoder:
    """The towers alone (no adapter), with the shared feature cache: what training reads."""
    import torch

    from vitrine.encoders.encoder import MultimodalEncoder

    if settings.encoders.torch_threads:
        torch.set_num_threads(settings.encoders.torch_threads)
    return MultimodalEncoder.create(
        settings.encoders.model, None, features_only=True, pretrained=settings.encoders.pretrained,
        device=settings.encoders.device,
        image_size=settings.encoders.image_size, cache_path=settings.storage.feature_cache_path,
        batch_size=settings.encoders.encode_batch_size, batch_precision=settings.encoders.batch_precision,
    )


def tune_fuse_weight(adapter: Adapter, catalog: Catalog, encoder: MultimodalEncoder, split: str = "val",
                     grid: tuple[float, ...] = (0.0, 0.1, 0.2, 0.35, 0.5, 0.65, 0.8)) -> dict[str, Any]:
    """Pick the photo weight of the fused product vector on ``split``: attribute-query nDCG@10
    and title->product MRR@10 over that split's products, averaged."""
    import torch

    with torch.inference_mode():
        return _tune_fuse_weight(adapter, catalog, encoder, split, grid)


def _tune_fuse_weight(adapter: Adapter, catalog: Catalog, encoder: MultimodalEncoder, split: str,
                      grid: tuple[float, ...]) -> dict[str, Any]:
    import numpy as np
    import torch

    from vitrine.evals import attribute_queries as aq
    from vitrine.metrics import mean_metrics

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


def adapter_config(recipe: GateRecipe, encoder: MultimodalEncoder, model: str) -> dict[str, Any]:
    """The adapter's architecture from a resolved recipe (bundled-catalogue runs)."""
    cfg: dict[str, Any] = {
        "image_dim": encoder.towers.image_dim, "text_dim": encoder.towers.text_dim, "dim": recipe.dim,
        "hidden": recipe.hidden, "towers_key": encoder.towers.key, "model": model,
        "name": recipe.name or recipe.kind,
    }
    if recipe.kind == "moe":
        cfg |= {"experts": recipe.experts, "top_k": recipe.top_k, "dynamic_k": recipe.dynamic_k,
                "balance_weight": recipe.balance_weight, "balance": recipe.balance, "bias_rate": recipe.bias_rate}
    return cfg | recipe.overrides


def train_gate(settings: Settings, recipe: GateRecipe, out: Path | None = None) -> dict[str, Any]:
    """Train one adapter by ``recipe`` on its catalogue's train split (the bundled one unless
    ``recipe.source``), early-stopped on val; writes it, its ``recipe.json`` (resolved), the
    training log and summary to ``out`` (default: the shipped weights folder of the recipe's
    name or kind). LoRA recipes save the towers' deltas in ``out/lora`` (vitrine/encoders/lora.py)."""
    import torch

    from vitrine.encoders.adapters import WEIGHTS_DIR, create_adapter
    from vitrine.training.adapter import TrainConfig, kind_options, seed_everything, train_adapter
    from vitrine.training.lora_data import limited_catalog
    from vitrine.training.pairs import build_pairs

    recipe = replace(recipe.resolved(), model=settings.encoders.model)
    t0 = time.time()
    seed_everything(recipe.seed)
    encoder = features_encoder(settings)
    catalog = limited_catalog(recipe.source, recipe.train_limit, recipe.seed)
    log.info("computing backbone features for %d products (cached after the first run)", len(catalog.rows))
    use_queries = recipe.queries and recipe.kind in ("mlp", "moe")
    train, train_rows = build_pairs(catalog, encoder, "train", queries=use_queries, seed=recipe.seed,
                                    views=recipe.views, degraded_share=recipe.degraded_share)
    val, val_rows = build_pairs(catalog, encoder, "val", queries=False, seed=recipe.seed)
    towers = _joint_towers(recipe, catalog, encoder, train_rows, val_rows, use_queries)
    adapter = create_adapter(recipe.kind, **adapter_config(recipe, encoder, settings.encoders.model))
    out = Path(out) if out else WEIGHTS_DIR / (recipe.name or recipe.kind)
    out.mkdir(parents=True, exist_ok=True)
    assert recipe.epochs is not None and recipe.patience is not None and recipe.lr is not None
    tcfg = TrainConfig(epochs=recipe.epochs, batch_size=recipe.batch_size, lr=recipe.lr, seed=recipe.seed,
                       patience=recipe.patience, ema_decay=recipe.ema, view_prob=recipe.view_prob,
                       gumbel_tau=recipe.gumbel_tau, route_kl_weight=recipe.route_kl, **kind_options(recipe.kind))
    result = train_adapter(adapter, train, val, tcfg, progress=True, log_path=out / "train_log.jsonl", towers=towers)
    summary = _summary(recipe, out, result, train, t0)
    summary["fuse_image_weight"] = _fuse_weight(adapter, recipe.kind, catalog, encoder)
    summary["torch_threads"] = torch.get_num_threads()
    _finish(adapter, towers, recipe, summary, val, catalog, encoder)
    adapter.save_pretrained(out)
    if towers is not None:
        towers.lora.save(out)
    save_recipe(out, recipe)
    (out / "train_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _joint_towers(recipe: GateRecipe, catalog: Catalog, encoder: MultimodalEncoder, train_rows: Any,
                  val_rows: Any, queries: bool) -> JointTowers | None:
    if not recipe.lora:
        return None
    from vitrine.encoders.lora import LoraSpec
    from vitrine.training.lora_data import joint_towers

    layers = None if recipe.lora_text_layers is None else list(recipe.lora_text_layers)
    spec = LoraSpec.from_mode(recipe.lora, rank=recipe.lora_rank, alpha=2.0 * recipe.lora_rank, text_layers=layers)
    return joint_towers(catalog, encoder, spec, train_rows=train_rows, val_rows=val_rows, queries=queries,
                        seed=recipe.seed, lr_scale=recipe.lora_lr_scale)


def _fuse_weight(adapter: Adapter, kind: str, catalog: Catalog, encoder: MultimodalEncoder) -> float | None:
    """The photo weight of the fused vector, tuned on val (the MoE's modality gate weighs photo
    and text per product: nothing to tune)."""
    if kind == "moe":
        return None
    tuning = tune_fuse_weight(adapter, catalog, encoder)
    adapter.config["fuse_image_weight"] = tuning["best"]
    adapter.config["fuse_tuning"] = {str(k): v for k, v in tuning["grid"].items()}
    return tuning["best"]


def _summary(recipe: GateRecipe, out: Path, result: TrainResult, train: PairSet, t0: float) -> dict[str, Any]:
    h = result.history
    return {
        "kind": recipe.kind, "out": display_path(out), "best_epoch": result.best_epoch,
        "val_MRR@10": result.best_score, "val": h[result.best_epoch] if result.best_epoch >= 0 else {},
        "fuse_image_weight": None, "train_pairs": len(train.text),
        "pseudo_queries": int(len(train.query_rows)) if train.query_rows is not None else 0,
        "photo_views": list(recipe.views), "view_prob": recipe.view_prob if recipe.views else 0.0,
        "degraded_share": recipe.degraded_share, "seconds": round(time.time() - t0, 1),
        "train_seconds": round(result.seconds, 1), "epochs_run": len(h),
        "seconds_per_epoch": round(h[-1]["seconds"] / len(h), 1) if h else None,
        "cpu_seconds_per_epoch": round(h[-1]["cpu_seconds"] / len(h), 1) if h else None,
        "torch_threads": None, "lora": None,
    }


def _finish(adapter: Adapter, towers: JointTowers | None, recipe: GateRecipe, summary: dict[str, Any],
            val: PairSet, catalog: Catalog, encoder: MultimodalEncoder) -> None:
    """The summary's LoRA, val figures and routing statistics."""
    import torch

    from vitrine.encoders.moe import CrossModalMoE
    from vitrine.training.lora_data import val_figures

    if towers is not None:
        summary["lora"] = {"mode": towers.lora.spec.mode, "rank": recipe.lora_rank,
                           "text_layers": None if recipe.lora_text_layers is None else list(recipe.lora_text_layers),
                           "lr_scale": recipe.lora_lr_scale,
                           "parameters": sum(p.numel() for p in towers.parameters())}
        adapter.config["lora"] = summary["lora"]
    summary["val_figures"] = val_figures(adapter, val, catalog, encoder, towers)
    if isinstance(adapter, CrossModalMoE):
        with torch.inference_mode():
            rv = towers.refresh(val, "val") if towers is not None else val
            summary["routing"] = adapter.routing_stats(torch.from_numpy(rv.image), torch.from_numpy(rv.text),
                                                       pairs=True)


def display_path(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(p)
