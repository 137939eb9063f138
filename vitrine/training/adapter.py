"""Training adapters over cached backbone features with a symmetric contrastive loss.

The towers stay frozen: their features are computed once (and cached), so an epoch over the
whole train split is a few matrix multiplications and training takes minutes on a CPU.

Items with the same group label (e.g. identical titles) count as positives of each other, so
duplicate titles in a batch are not pushed apart as false negatives.

A text-only catalogue (``PairSet.image`` None) trains the same loop on the text side alone: a
product's vector is its text token routed without a photo (``adapter(None, text).text``, as the
engine indexes a product without a photo), its second view a title variant (``PairSet.variant``)
in place of the photo, and validation ranks the held-out products' text vectors.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from vitrine.encoders.adapters import Adapter
from vitrine.progress import progress_bar
from vitrine.training.pairs import PairSet

if TYPE_CHECKING:  # pragma: no cover
    from vitrine.training.lora import JointTowers

log = logging.getLogger(__name__)


@dataclass
class TrainConfig:
    epochs: int = 40
    batch_size: int = 1024
    lr: float = 2e-3
    weight_decay: float = 0.05
    warmup_epochs: float = 1.0
    patience: int = 6
    seed: int = 0
    aux_weight: float = 1.0  # weight of an adapter's own auxiliary losses (MoE balance, z-loss)
    query_weight: float = 0.5  # weight of the pseudo-query -> photo loss when queries are given
    text_text_weight: float = 0.0  # weight of a query -> product-text loss (keeps text-only feeds good)
    modality_dropout: float = 0.0  # chance that a product's photo is hidden during training
    ema_decay: float = 0.0  # > 0: validate and keep an exponential moving average of the weights
    view_prob: float = 0.5  # chance that a row trains on an augmented photo view (when views are given)
    gumbel_tau: float = 0.0  # > 0: adapters with a router route by straight-through Gumbel-softmax at this temperature
    route_kl_weight: float = 0.0  # weight of the routing-agreement loss (symmetric KL, photo vs title routes)
    feature_stats: bool = True  # False: keep the adapter's own input standardisation (fine-tuning a trained one)
    device: str = "cpu"
    extra: dict[str, Any] = field(default_factory=dict)


def kind_options(kind: str) -> dict[str, float]:
    """The :class:`TrainConfig` fields an adapter kind trains with beyond the defaults: the MoE gate
    hides a product's photo 15% of the time (so its text side learns alone) and adds a
    query -> product-text loss at half weight (keeps text-only catalogues good)."""
    return {"modality_dropout": 0.15, "text_text_weight": 0.5} if kind == "moe" else {}


@dataclass
class TrainResult:
    best_epoch: int
    best_score: float
    history: list[dict[str, float]]
    seconds: float


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def multi_positive_ce(logits: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Cross-entropy against a uniform distribution over each row's positives."""
    target = pos.float()
    target = target / target.sum(1, keepdim=True).clamp_min(1.0)
    return -(target * F.log_softmax(logits, dim=1)).sum(1).mean()


def contrastive_loss(a: torch.Tensor, b: torch.Tensor, ga: torch.Tensor, gb: torch.Tensor,
                     scale: torch.Tensor) -> torch.Tensor:
    """Symmetric InfoNCE between a and b (normalised), positives where groups match."""
    logits = scale * a @ b.t()
    pos = ga[:, None] == gb[None, :]
    return 0.5 * (multi_positive_ce(logits, pos) + multi_positive_ce(logits.t(), pos.t()))


@torch.inference_mode()
def retrieval_scores(queries: torch.Tensor, gallery: torch.Tensor, q_group: torch.Tensor,
                     g_group: torch.Tensor, k: int = 10) -> dict[str, float]:
    """Hit@1, Hit@k (any relevant item in the top k) and MRR@k; relevant = same group."""
    r1 = rk = mrr = 0.0
    for s in range(0, len(queries), 1024):
        sims = queries[s:s + 1024] @ gallery.t()
        top = sims.topk(k, dim=1).indices
        rel = g_group[top] == q_group[s:s + 1024, None]
        r1 += rel[:, 0].float().sum().item()
        rk += rel.any(1).float().sum().item()
        first = torch.where(rel.any(1), rel.float().argmax(1), torch.full_like(rel[:, 0], -1, dtype=torch.long))
        mrr += torch.where(first >= 0, 1.0 / (first.float() + 1.0), torch.zeros_like(first, dtype=torch.float)).sum().item()
    n = len(queries)
    return {"Hit@1": r1 / n, f"Hit@{k}": rk / n, f"MRR@{k}": mrr / n}


def evaluate_pairs(adapter: Adapter, data: PairSet, device: str = "cpu") -> dict[str, float]:
    """Title -> photo retrieval over the set's own photos (the KAGL protocol in miniature); text-only:
    title variant -> product text over the set's own products (each its text token alone)."""
    adapter.eval()
    with torch.inference_mode():
        if data.text_only:
            img = adapter(None, torch.from_numpy(data.text).to(device)).text
            txt = adapter(None, torch.from_numpy(data.variant).to(device)).text
        else:
            img = adapter(torch.from_numpy(data.image).to(device), None).image
            txt = adapter(None, torch.from_numpy(data.text).to(device)).text
    g = torch.from_numpy(data.group).to(device)
    return retrieval_scores(txt, img, g, g)  # type: ignore[arg-type]


def train_adapter(
    adapter: Adapter,
    train: PairSet,
    val: PairSet,
    cfg: TrainConfig,
    *,
    progress: bool = True,
    log_path: str | Path | None = None,
    score_fn: Callable[[dict[str, float]], float] | None = None,
    towers: JointTowers | None = None,
) -> TrainResult:
    """Train ``adapter`` in place; keeps the weights of the best validation epoch.

    ``towers``: LoRA deltas of the towers trained jointly (vitrine/training/lora.py): a
    step's titles, pseudo-queries and photos go through them instead of the cached features, at
    ``towers.lr_scale`` times the learning rate; validation re-embeds val through them.

    Text-only ``train`` (no photos): the title-variant <-> product-text contrastive loss stands in
    for title <-> photo and the pseudo-queries target the products' text vectors (module doc)."""
    seed_everything(cfg.seed)
    dev = torch.device(cfg.device)
    adapter.to(dev)
    text_only = train.text_only
    if text_only and towers is not None:
        raise ValueError("tower LoRA trains with photos; a text-only PairSet has none")
    if hasattr(adapter, "set_training_routing"):  # the MoE gate: how it routes while training
        adapter.set_training_routing(gumbel_tau=cfg.gumbel_tau)
    txt = torch.from_numpy(train.text).to(dev)
    # text-only: ``img`` holds the title variants (text features), the products' second view
    img = torch.from_numpy(train.variant if text_only else train.image).to(dev)  # type: ignore[arg-type]
    if cfg.feature_stats:
        adapter.set_feature_stats(None if text_only else img, txt)
    score_fn = score_fn or (lambda m: m["MRR@10"])

    grp = torch.from_numpy(train.group).to(dev)
    has_q = train.query_rows is not None and train.query_text is not None
    if has_q:
        q_rows = torch.from_numpy(train.query_rows).to(dev)
        q_txt = torch.from_numpy(train.query_text).to(dev)
        q_sub = torch.from_numpy(train.query_subset).to(dev)
        q_key = torch.from_numpy(train.query_key).to(dev)
        p_keys = torch.from_numpy(train.product_keys).to(dev)
    hard = torch.from_numpy(train.hard_negatives).to(dev) if train.hard_negatives is not None else None
    views = view_ok = None
    if train.image_views is not None:  # a view may exist for some rows only (NaN rows): they keep their photo
        view_ok = torch.from_numpy(~np.isnan(train.image_views).any(-1)).to(dev)
        views = torch.from_numpy(np.nan_to_num(train.image_views)).to(dev)

    params = [p for p in adapter.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups: list[dict[str, Any]] = [{"params": decay, "weight_decay": cfg.weight_decay},
                                    {"params": no_decay, "weight_decay": 0.0}]
    if towers is not None:
        groups.append({"params": towers.parameters(), "weight_decay": 0.0, "lr_scale": towers.lr_scale})
        params = params + towers.parameters()
    opt = torch.optim.AdamW(groups, lr=cfg.lr)
    n = len(img)
    steps_per_epoch = max(1, math.ceil(n / cfg.batch_size))
    total = steps_per_epoch * cfg.epochs
    warm = int(steps_per_epoch * cfg.warmup_epochs)

    def lr_at(step: int) -> float:
        if step < warm:
            return cfg.lr * (step + 1) / max(1, warm)
        prog = (step - warm) / max(1, total - warm)
        return cfg.lr * 0.5 * (1 + math.cos(math.pi * prog))

    best_state: dict[str, torch.Tensor] | None = None
    best_towers: dict[str, torch.Tensor] | None = None
    best_score, best_epoch, bad_epochs = -1.0, -1, 0
    history: list[dict[str, float]] = []
    t0, c0 = time.time(), time.process_time()
    step = 0
    gen = torch.Generator(device="cpu").manual_seed(cfg.seed)
    ema: dict[str, torch.Tensor] | None = None
    if cfg.ema_decay > 0:
        ema = {k: v.detach().clone() for k, v in adapter.state_dict().items()}
    log_file = open(log_path, "w", encoding="utf-8") if log_path else None
    bar = progress_bar(total=cfg.epochs, desc=f"train {adapter.kind}", unit="epoch", enabled=progress)
    try:
        for epoch in range(cfg.epochs):
            adapter.train()
            perm = torch.randperm(n, generator=gen).to(dev)
            sums: dict[str, float] = {}
            for s in range(0, n, cfg.batch_size):
                idx = perm[s:s + cfg.batch_size]
                if hard is not None:
                    # Pull each row's hard negatives into the batch so the loss must separate them.
                    extra_rows = hard[idx[: len(idx) // 4]].flatten()
                    extra_rows = extra_rows[extra_rows >= 0]
                    idx = torch.unique(torch.cat([idx, extra_rows]))
                for g in opt.param_groups:
                    g["lr"] = lr_at(step) * g.get("lr_scale", 1.0)
                bi, bt, bg = img[idx], txt[idx], grp[idx]
                if views is not None and cfg.view_prob > 0:
                    # Feature-level augmentation: some rows see an augmented view of their photo.
                    v = torch.randint(0, len(views), (len(idx),), generator=gen).to(dev)
                    use = (torch.rand(len(idx), generator=gen) < cfg.view_prob).to(dev)
                    use = use & view_ok[v, idx]
                    bi = torch.where(use[:, None], views[v, idx], bi)
                if cfg.modality_dropout > 0:
                    hide = torch.rand(len(idx), generator=gen).to(dev) < cfg.modality_dropout
                else:
                    hide = None
                if towers is not None:  # the step's rows through the towers' deltas (with grad)
                    bi, bt = towers.batch(idx, bi, bt)
                scale = adapter.logit_scale.exp().clamp(max=100.0)
                if text_only:  # products as the engine indexes them without a photo: the text token alone
                    out = adapter(None, bt)
                    var = adapter(None, bi)
                    loss = contrastive_loss(var.text, out.text, bg, bg, scale)
                    if var.aux.get("loss") is not None:  # the variants' routing is balanced too
                        loss = loss + cfg.aux_weight * var.aux["loss"]
                else:
                    out = adapter.training_forward(bi, bt, hide_image=hide) if hasattr(adapter, "training_forward") \
                        else adapter(bi, bt)
                    loss = contrastive_loss(out.text, out.image, bg, bg, scale)
                parts = {"contrastive": loss.item()}
                if "fused" in out.aux.get("train_terms", ()) and not text_only:
                    lf = contrastive_loss(out.text, out.fused, bg, bg, scale)
                    loss = loss + 0.5 * lf
                    parts["fused"] = lf.item()
                if has_q:
                    # Pseudo-queries whose product is in this batch; every batch product that
                    # matches the query's attributes is a positive.
                    inb = torch.zeros(n, dtype=torch.bool, device=dev)
                    inb[idx] = True
                    sel = inb[q_rows].nonzero().flatten()
                    if len(sel) > cfg.batch_size:
                        sel = sel[torch.randperm(len(sel), generator=gen)[: cfg.batch_size].to(dev)]
                    if len(sel):
                        qo = adapter(None, towers.queries(sel, q_txt[sel]) if towers is not None else q_txt[sel])
                        pos = p_keys[q_sub[sel]][:, idx] == q_key[sel][:, None]
                        target = out.text if text_only else \
                            out.fused if "fused" in out.aux.get("train_terms", ()) else out.image
                        lq = multi_positive_ce(scale * qo.text @ target.t(), pos)
                        if cfg.text_text_weight > 0 and not text_only:
                            lq = lq + cfg.text_text_weight * multi_positive_ce(scale * qo.text @ out.text.t(), pos)
                        loss = loss + cfg.query_weight * lq
                        parts["query"] = lq.item()
                route_kl = out.aux.get("route_kl")
                if cfg.route_kl_weight > 0 and route_kl is not None:
                    loss = loss + cfg.route_kl_weight * route_kl
                    parts["route_kl"] = float(route_kl.item())
                aux_loss = out.aux.get("loss")
                if aux_loss is not None:
                    loss = loss + cfg.aux_weight * aux_loss
                    parts["aux"] = float(aux_loss.item())
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                opt.step()
                if hasattr(adapter, "after_step"):  # e.g. the MoE gate's loss-free load balancing
                    adapter.after_step(out.aux)
                if ema is not None:
                    with torch.no_grad():
                        for k, v in adapter.state_dict().items():
                            if v.is_floating_point():
                                ema[k].lerp_(v, 1.0 - cfg.ema_decay)
                            else:
                                ema[k].copy_(v)
                step += 1
                for k, v in parts.items():
                    sums[k] = sums.get(k, 0.0) + v
            live: dict[str, torch.Tensor] | None = None
            if ema is not None:  # validate (and keep) the averaged weights
                live = {k: v.detach().clone() for k, v in adapter.state_dict().items()}
                adapter.load_state_dict(ema)
            metrics = evaluate_pairs(adapter, towers.refresh(val, "val") if towers is not None else val, cfg.device)
            score = score_fn(metrics)
            row = {"epoch": epoch, **{f"loss_{k}": v / steps_per_epoch for k, v in sums.items()}, **metrics,
                   "score": score, "lr": lr_at(step - 1), "seconds": time.time() - t0,
                   "cpu_seconds": time.process_time() - c0}
            history.append(row)
            if log_file:
                log_file.write(json.dumps(row) + "\n")
                log_file.flush()
            log.info("epoch %d %s", epoch, {k: round(v, 4) for k, v in row.items() if isinstance(v, float)})
            bar.set_postfix(score=f"{score:.4f}", best=f"{max(best_score, score):.4f}")
            bar.update(1)
            improved = score > best_score
            if improved:
                best_score, best_epoch, bad_epochs = score, epoch, 0
                best_state = {k: v.detach().clone() for k, v in adapter.state_dict().items()}
                best_towers = towers.state() if towers is not None else None
            if live is not None:
                adapter.load_state_dict(live)
            if not improved:
                bad_epochs += 1
                if bad_epochs >= cfg.patience:
                    log.info("early stop at epoch %d (best %d: %.4f)", epoch, best_epoch, best_score)
                    break
    finally:
        bar.close()
        if log_file:
            log_file.close()
    if best_state is not None:
        adapter.load_state_dict(best_state)
    if towers is not None and best_towers is not None:
        towers.load_state(best_towers)
        adapted = towers.refresh(train, "train")  # the balance settles on the adapted tokens
        img, txt = torch.from_numpy(adapted.image).to(dev), torch.from_numpy(adapted.text).to(dev)
    balance: dict[str, float] = {}
    if hasattr(adapter, "calibrate_balance"):
        balance = adapter.calibrate_balance(None if text_only else img, txt)
        if balance:
            log.info("routing balance on the training tokens: %s", balance)
    adapter.eval()
    adapter.config["train"] = {"config": asdict(cfg), "best_epoch": best_epoch, "val_score": best_score,
                               **({"balance": balance} if balance else {})}
    return TrainResult(best_epoch=best_epoch, best_score=best_score, history=history, seconds=time.time() - t0)
