"""``vitrine train``: the alignment adapters / MoE gate, and the intent classifier.

The commands and their glue (bundled catalogue -> cached backbone features -> adapter -> shipped
weights) live here together; heavy imports (torch, the encoders) happen inside the functions so
that ``vitrine --help`` stays fast.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from vitrine.cli.base import main, make_settings

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from vitrine.encoders.adapters import Adapter
    from vitrine.encoders.encoder import MultimodalEncoder
    from vitrine.encoders.train import PairSet
    from vitrine.evals.datasets import Catalog
    from vitrine.settings import Settings

log = logging.getLogger("vitrine.train")

#: Augmented photo views the adapters train on by default (vitrine/encoders/images.py:
#: augment_view): a mirrored photo, five seeded crops and, for half of the photos, the degraded
#: views (grayscale, 32 px, inverted, a tight crop), one of them in place of the photo for 70% of
#: the rows of a batch. Chosen on the val split (docs/models.md).
DEFAULT_VIEWS: tuple[str, ...] = ("flip", "crop1", "crop2", "crop3", "crop4", "crop5", "gray", "tiny", "invert", "tight1")
DEFAULT_VIEW_PROB = 0.7
DEFAULT_DEGRADED_SHARE = 0.5  # share of the training photos given the degraded views (the shipped gate's)

#: The MoE gate's recipe (the best on val in the seed study; docs/models.md): 16 experts, 4 per token,
#: experts of hidden width 1024.
DEFAULT_EXPERTS = 16
DEFAULT_TOP_K = 4
DEFAULT_MOE_HIDDEN = 1024


@main.group()
def train() -> None:
    """Train the adapters / MoE gate or the intent classifier."""


@train.command("gate")
@click.option("--kind", type=click.Choice(["linear", "mlp", "moe"]), default="moe", show_default=True,
              help="The aligner: the cross-modal MoE gate or the plain MLP / linear heads")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Output folder (default: the shipped weights folder of this kind)")
@click.option("--model", default=None, help="Tower config (default from settings)")
@click.option("--source", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Catalogue folder with styles.csv, splits.csv, images/ (default: bundled)")
@click.option("--epochs", type=int, default=None,
              help="Passes over the train split (default: 40, the shipped gate's schedule; with --data: 12)")
@click.option("--batch-size", type=int, default=1024, show_default=True)
@click.option("--lr", type=float, default=None,
              help="Learning rate (default 2e-3; with --data fine-tuning the served aligner: 5e-4)")
@click.option("--dim", type=int, default=256, show_default=True, help="Shared space width")
@click.option("--hidden", type=int, default=None,
              help=f"Hidden width of the experts / MLP heads (default {DEFAULT_MOE_HIDDEN} for the MoE, 512 otherwise)")
@click.option("--experts", type=int, default=DEFAULT_EXPERTS, show_default=True, help="MoE: number of experts")
@click.option("--top-k", type=int, default=DEFAULT_TOP_K, show_default=True, help="MoE: experts per token")
@click.option("--dynamic-k", is_flag=True, help="MoE: fewer experts for confident routes")
@click.option("--balance-weight", type=float, default=0.05, show_default=True,
              help="MoE: weight of the load-balancing loss")
@click.option("--balance", type=click.Choice(["bias", "loss"]), default="bias", show_default=True,
              help="MoE: even out expert load with a choice bias (loss-free, DeepSeek-V3 style) on top of "
                   "the balancing loss, or with the loss alone")
@click.option("--bias-rate", type=float, default=0.01, show_default=True,
              help="MoE: how far the choice bias moves per training step (--balance bias)")
@click.option("--queries/--no-queries", default=True, show_default=True,
              help="Also train on attribute pseudo-queries (MoE and MLP)")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--patience", type=int, default=None,
              help="Epochs without a better val score before stopping (default: as many as --epochs, i.e. "
                   "the whole cosine schedule runs and the best val epoch is kept, as for the shipped gate; "
                   "with --data: 4)")
@click.option("--name", default=None, help="Name recorded in the adapter config")
@click.option("--ema", type=float, default=0.0, show_default=True,
              help="Validate and keep an exponential moving average of the weights with this decay per "
                   "step (e.g. 0.99); 0 = off")
@click.option("--views", default=",".join(DEFAULT_VIEWS), show_default=True,
              help="Augmented photo views to train on (comma-separated: flip, crop<N>, gray, tiny, invert, tight<N>; "
                   "'' = none); their "
                   "features are computed once and cached")
@click.option("--view-prob", type=click.FloatRange(0.0, 1.0), default=DEFAULT_VIEW_PROB, show_default=True,
              help="Chance that a training row sees one of the augmented views instead of its photo")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override an adapter config value, e.g. --set dropout=0.3 (repeatable; JSON values)")
@click.option("--degraded-share", type=click.FloatRange(0.0, 1.0), default=DEFAULT_DEGRADED_SHARE, show_default=True,
              help="Share of the training photos that get the degraded views (gray, tiny, invert, tight<N>): "
                   "their features cost as much to compute as the photos'")
@click.option("--gumbel-tau", type=click.FloatRange(min=0.0), default=0.0, show_default=True,
              help="MoE: straight-through Gumbel-softmax routing at this temperature while training; 0 = noisy top-k")
@click.option("--route-kl", type=click.FloatRange(min=0.0), default=0.0, show_default=True,
              help="MoE: weight of a routing-agreement loss (symmetric KL between a product's photo and title routes)")
@click.option("--data", "data_dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Train on this ingested data dir's catalogue (its photos + pseudo-queries; early-stops on "
                   "held-out products), then install it by hot swap and re-tune (docs/tuning.md)")
@click.option("--no-install", is_flag=True, help="With --data: train and save only")
@click.option("--init", "init", type=click.Choice(["auto", "fresh", "live"]), default="auto", show_default=True,
              help="With --data: train fresh weights, or fine-tune the aligner the data dir serves (same --kind); "
                   "auto: live for a text-only catalogue served by an aligner of --kind, else fresh")
@click.option("--lora", type=click.Choice(["text", "image", "both"]), default=None,
              help="Also train LoRA deltas of the towers with the gate (MiniLM's attention query/value; the image "
                   "tower's last stage), saved in OUT/lora (needs the `train` extra: peft)")
@click.option("--lora-rank", type=click.IntRange(1, 64), default=8, show_default=True, help="LoRA rank (alpha = 2 x rank)")
@click.option("--lora-text-layers", default="4,5", show_default=True,
              help="MiniLM layers with deltas (comma-separated, 'all' = every layer): the top ones cost least")
@click.option("--lora-lr-scale", type=float, default=0.25, show_default=True,
              help="The deltas' learning rate as a share of --lr")
@click.option("--train-limit", type=int, default=None,
              help="Train on a seeded subset of this many train products (val stays whole): short comparisons")
def train_gate(kind: str, out: Path | None, model: str | None, source: Path | None, epochs: int | None, batch_size: int,
               lr: float | None, dim: int, hidden: int | None, experts: int, top_k: int, dynamic_k: bool, balance_weight: float,
               balance: str, bias_rate: float, queries: bool, seed: int, patience: int | None, name: str | None,
               ema: float, views: str, view_prob: float, degraded_share: float, overrides: tuple[str, ...],
               gumbel_tau: float, route_kl: float, data_dir: Path | None = None, no_install: bool = False,
               lora: str | None = None, lora_rank: int = 8, lora_text_layers: str = "4,5", lora_lr_scale: float = 0.25,
               train_limit: int | None = None, init: str = "auto") -> None:
    """Train an alignment adapter over cached backbone features of the train split.

    Early-stops on the val split's title->photo MRR@10; writes config.json + model.safetensors,
    a training log (train_log.jsonl) and the val metrics. With no options: the MoE gate's recipe
    into vitrine/encoders/weights/moe (docs/models.md).
    """
    if hidden is None:
        hidden = DEFAULT_MOE_HIDDEN if kind == "moe" else 512
    if lora and data_dir is not None:
        raise click.BadParameter("tower LoRA trains on the bundled (or --source) catalogue, not with --data",
                                 param_hint="--lora")
    if data_dir is not None:
        from vitrine.cli.tune import train_gate_on_data

        epochs = 12 if epochs is None else epochs
        patience = 4 if patience is None else patience

        click.echo(json.dumps(train_gate_on_data(data_dir, kind=kind, out=out, epochs=epochs, patience=patience,
                                                 batch_size=batch_size, lr=lr, dim=dim, hidden=hidden, seed=seed,
                                                 install=not no_install, overrides=_parse_overrides(overrides),
                                                 init=init),
                              indent=2))
        return
    epochs = 40 if epochs is None else epochs
    patience = epochs if patience is None else patience
    if lora and kind != "moe":
        raise click.BadParameter("tower LoRA trains with the MoE gate only", param_hint="--lora")
    text_layers = None if lora_text_layers.strip() == "all" else _parse_layers(lora_text_layers)
    settings = make_settings(model=model)
    result = train_gate_command(
        settings, kind=kind, out=out, source=source, epochs=epochs, batch_size=batch_size,
        lr=lr if lr is not None else 2e-3, dim=dim,
        hidden=hidden, experts=experts, top_k=top_k, dynamic_k=dynamic_k, balance_weight=balance_weight,
        balance=balance, bias_rate=bias_rate, queries=queries, seed=seed,
        patience=patience, name=name, ema_decay=ema, overrides=_parse_overrides(overrides),
        views=_parse_views(views), view_prob=view_prob, degraded_share=degraded_share,
        train_options={"gumbel_tau": gumbel_tau, "route_kl_weight": route_kl},
        lora=lora, lora_rank=lora_rank, lora_text_layers=text_layers, lora_lr_scale=lora_lr_scale,
        train_limit=train_limit,
    )
    click.echo(json.dumps(result, indent=2))


def _parse_overrides(items: tuple[str, ...]) -> dict[str, Any]:
    from vitrine.encoders.adapters import config_overrides
    from vitrine.errors import ModelError

    try:
        return config_overrides(items)
    except ModelError as e:
        raise click.BadParameter(str(e), param_hint="--set") from e


def _parse_layers(text: str) -> list[int]:
    try:
        return sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise click.BadParameter(f"{text!r} is not comma-separated layer numbers", param_hint="--lora-text-layers") from None


def _parse_views(text: str) -> tuple[str, ...]:
    from vitrine.encoders.images import check_view
    from vitrine.errors import InvalidInput

    views = tuple(v.strip() for v in text.split(",") if v.strip())
    try:
        return tuple(check_view(v) for v in views)
    except InvalidInput as e:
        raise click.BadParameter(str(e), param_hint="--views") from e


@train.command("intent")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=None)
@click.option("--init-from", type=click.Path(path_type=Path, exists=True), default=None,
              help="Start from a pretrained Qwen checkpoint (HF folder or GGUF file)")
@click.option("--epochs", type=int, default=None, help="Default: the training defaults (vitrine/intent/training.py)")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--config", default=None,
              help="Architecture config: a shipped name (vitrine/intent/configs) or a JSON file")
@click.option("--train-per-label", type=int, default=None, help="Generated training queries per label")
@click.option("--set", "settings", multiple=True, metavar="KEY=VALUE",
              help="Override a training setting, e.g. --set token_dropout=0.15 (repeatable)")
@click.option("--members", type=click.IntRange(1, 9), default=None,
              help="Ensemble size: classifiers trained on their own draws of the queries, probabilities "
                   "averaged (default 5)")
@click.option("--no-heldout", is_flag=True, help="Measure on validation only (for tuning), not on held-out queries")
def train_intent(out: Path | None, init_from: Path | None, epochs: int | None, seed: int, config: str | None,
                 train_per_label: int | None, settings: tuple[str, ...], no_heldout: bool,
                 members: int | None) -> None:
    """Train the Qwen2-architecture intent classifier on generated queries.

    Model selection (best epoch) uses validation queries from templates kept out of training."""
    kwargs: dict[str, Any] = {"out": out, "init_from": init_from, "seed": seed, "heldout": not no_heldout}
    if epochs is not None:
        kwargs["epochs"] = epochs
    if config is not None:
        kwargs["config"] = config
    if train_per_label is not None:
        kwargs["train_per_label"] = train_per_label
    if members is not None:
        kwargs["members"] = members
    hparams: dict[str, float] = {}
    for item in settings:
        key, sep, value = item.partition("=")
        try:
            hparams[key.strip()] = float(value)
        except ValueError:
            raise click.BadParameter(f"{item!r} is not KEY=NUMBER", param_hint="--set") from None
        if not sep:
            raise click.BadParameter(f"{item!r} is not KEY=NUMBER", param_hint="--set")
    if hparams:
        kwargs["hparams"] = hparams
    click.echo(json.dumps(train_intent_command(**kwargs), indent=2, ensure_ascii=False))


# -- the glue --------------------------------------------------------------------------------
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
        batch_size=settings.encoders.encode_batch_size,
    )


def hard_negative_rows(rows: list[dict[str, str]], subset: np.ndarray, per_row: int = 4,
                       seed: int = 0) -> np.ndarray:
    """For each row of ``subset``: rows of the same article type but another colour or gender."""
    import numpy as np

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
                progress: bool = True, views: tuple[str, ...] = (), degraded_share: float = DEFAULT_DEGRADED_SHARE,
                ) -> tuple[PairSet, np.ndarray]:
    """A split's (photo, title) pairs as a :class:`PairSet` (with the photo views' features and,
    with ``queries``, attribute pseudo-queries) and the catalogue rows they come from."""
    import numpy as np

    from vitrine.encoders.images import is_degraded_view
    from vitrine.encoders.train import PairSet
    from vitrine.evals import attribute_queries as aq

    img_f, txt_f = catalog.features(encoder, progress=progress)
    rows_idx = np.flatnonzero(catalog.split_mask(split))
    groups = catalog.title_groups()[rows_idx]
    image_views = None
    if views:
        log.info("augmented photo views %s of %d photos (cached after the first run)", ",".join(views), len(rows_idx))
        image_views = catalog.view_features(encoder, views, rows_idx, progress=progress,
                                            shares={v: degraded_share for v in views if is_degraded_view(v)},
                                            seed=seed)
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
    from vitrine.evals.metrics import mean_metrics

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
                       view_prob: float = DEFAULT_VIEW_PROB, degraded_share: float = DEFAULT_DEGRADED_SHARE, train_options: dict[str, Any] | None = None,
                       lora: str | None = None, lora_rank: int = 8, lora_text_layers: list[int] | None = None,
                       lora_lr_scale: float = 0.25, train_limit: int | None = None,
                       ) -> dict[str, Any]:
    """Train one adapter on the bundled (or ``source``) catalogue's train split, early-stopped on
    val; writes it to ``out`` (default: the shipped weights folder of ``name`` or ``kind``).
    ``train_options``: further :class:`~vitrine.encoders.train.TrainConfig` fields. ``lora``
    (``text``, ``image``, ``both``): LoRA deltas of the towers trained jointly, saved in
    ``out/lora`` (vitrine/encoders/lora.py). ``train_limit``: a seeded subset of the train split."""
    import torch

    from vitrine.encoders.adapters import WEIGHTS_DIR, create_adapter
    from vitrine.encoders.train import TrainConfig, kind_options, seed_everything, train_adapter
    from vitrine.cli.train_lora import joint_towers, limited_catalog, val_figures

    t0 = time.time()
    seed_everything(seed)
    encoder = features_encoder(settings)
    catalog = limited_catalog(source, train_limit, seed)
    log.info("computing backbone features for %d products (cached after the first run)", len(catalog.rows))
    use_queries = queries and kind in ("mlp", "moe")
    train, train_rows = build_pairs(catalog, encoder, "train", queries=use_queries, seed=seed, views=views,
                                    degraded_share=degraded_share)
    val, val_rows = build_pairs(catalog, encoder, "val", queries=False, seed=seed)
    towers = None
    if lora:
        from vitrine.encoders.lora import LoraSpec

        spec = LoraSpec.from_mode(lora, rank=lora_rank, alpha=2.0 * lora_rank, text_layers=lora_text_layers)
        towers = joint_towers(catalog, encoder, spec, train_rows=train_rows, val_rows=val_rows,
                              queries=use_queries, seed=seed, lr_scale=lora_lr_scale)
    cfg_adapter: dict[str, Any] = {
        "image_dim": encoder.towers.image_dim, "text_dim": encoder.towers.text_dim, "dim": dim,
        "hidden": hidden, "towers_key": encoder.towers.key, "model": settings.encoders.model,
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
                       ema_decay=ema_decay, view_prob=view_prob, **(kind_options(kind) | (train_options or {})))
    result = train_adapter(adapter, train, val, tcfg, progress=True, log_path=out / "train_log.jsonl", towers=towers)
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
        "photo_views": list(views), "view_prob": view_prob if views else 0.0, "degraded_share": degraded_share,
        "seconds": round(time.time() - t0, 1),
        "train_seconds": round(result.seconds, 1), "epochs_run": len(result.history),
        "seconds_per_epoch": round(result.history[-1]["seconds"] / len(result.history), 1) if result.history else None,
        "cpu_seconds_per_epoch": round(result.history[-1]["cpu_seconds"] / len(result.history), 1)
        if result.history else None,
        "torch_threads": torch.get_num_threads(), "lora": None,
    }
    if towers is not None:
        summary["lora"] = {"mode": towers.lora.spec.mode, "rank": lora_rank, "text_layers": lora_text_layers,
                           "lr_scale": lora_lr_scale, "parameters": sum(p.numel() for p in towers.parameters())}
        adapter.config["lora"] = summary["lora"]
    summary["val_figures"] = val_figures(adapter, val, catalog, encoder, towers)
    if hasattr(adapter, "routing_stats"):
        with torch.inference_mode():
            rv = towers.refresh(val, "val") if towers is not None else val
            summary["routing"] = adapter.routing_stats(torch.from_numpy(rv.image), torch.from_numpy(rv.text),
                                                       pairs=True)
    adapter.save_pretrained(out)
    if towers is not None:
        towers.lora.save(out)
    (out / "train_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _display_path(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(p)


def train_intent_command(**kwargs: Any) -> dict[str, Any]:
    try:
        from vitrine.intent.training import train_intent  # noqa: PLC0415 - optional extra
    except ImportError as e:  # pragma: no cover
        raise click.ClickException(f"intent training is unavailable: {e}") from e
    from vitrine.settings import Settings

    kwargs.setdefault("cache_dir", Settings().storage.cache_dir / "intent")  # the converted Qwen tokenizer's cache
    return train_intent(**kwargs)
