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
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np
import torch
import torch.nn.functional as F

from vitrine.encoders.adapter_base import Adapter
from vitrine.encoders.moe import CrossModalMoE
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


class KindOptions(TypedDict, total=False):
    """:class:`TrainConfig` fields that :func:`kind_options` sets."""

    modality_dropout: float
    text_text_weight: float


def kind_options(kind: str) -> KindOptions:
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
    return retrieval_scores(txt, img, g, g)


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
    if train.text_only and towers is not None:
        raise ValueError("tower LoRA trains with photos; a text-only PairSet has none")
    if isinstance(adapter, CrossModalMoE):  # the MoE gate: how it routes while training
        adapter.set_training_routing(gumbel_tau=cfg.gumbel_tau)
    data = _Tensors.of(train, dev)
    if cfg.feature_stats:
        adapter.set_feature_stats(None if data.text_only else data.img, data.txt)
    run = _Run(adapter, cfg, data, towers, score_fn or (lambda m: m["MRR@10"]))
    log_file = open(log_path, "w", encoding="utf-8") if log_path else None
    bar: Any = progress_bar(total=cfg.epochs, desc=f"train {adapter.kind}", unit="epoch", enabled=progress)
    try:
        for epoch in range(cfg.epochs):
            row = run.epoch(epoch, val)
            if log_file:
                log_file.write(json.dumps(row) + "\n")
                log_file.flush()
            bar.set_postfix(score=f"{row['score']:.4f}", best=f"{run.best_score:.4f}")
            bar.update(1)
            if run.bad_epochs and run.bad_epochs >= cfg.patience:
                log.info("early stop at epoch %d (best %d: %.4f)", epoch, run.best_epoch, run.best_score)
                break
    finally:
        bar.close()
        if log_file:
            log_file.close()
    return run.finish(train)


@dataclass
class _Tensors:
    """A PairSet's arrays as tensors on the training device. Text-only: ``img`` holds the title
    variants (text features), the products' second view."""

    text_only: bool
    img: torch.Tensor
    txt: torch.Tensor
    grp: torch.Tensor
    queries: tuple[torch.Tensor, ...] | None  # (rows, text, subset, key, product keys)
    hard: torch.Tensor | None
    views: torch.Tensor | None
    view_ok: torch.Tensor | None

    @classmethod
    def of(cls, train: PairSet, dev: torch.device) -> _Tensors:
        def t(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(a).to(dev)

        queries = None
        q_subset, q_key, p_keys = train.query_subset, train.query_key, train.product_keys
        if train.query_rows is not None and train.query_text is not None:
            assert q_subset is not None and q_key is not None and p_keys is not None  # attach_queries sets all five
            queries = (t(train.query_rows), t(train.query_text), t(q_subset), t(q_key), t(p_keys))
        views = view_ok = None
        if train.image_views is not None:  # a view may exist for some rows only (NaN rows): they keep their photo
            view_ok = t(~np.isnan(train.image_views).any(-1))
            views = t(np.nan_to_num(train.image_views))
        img = train.variant if train.image is None else train.image  # text-only: the title variants
        assert img is not None  # PairSet refuses a text-only set without variants
        return cls(text_only=train.text_only, img=t(img),
                   txt=t(train.text), grp=t(train.group), queries=queries,
                   hard=t(train.hard_negatives) if train.hard_negatives is not None else None,
                   views=views, view_ok=view_ok)


class _Run:
    """One training run's state: optimiser, schedule, best weights, EMA, history."""

    def __init__(self, adapter: Adapter, cfg: TrainConfig, data: _Tensors, towers: JointTowers | None,
                 score_fn: Callable[[dict[str, float]], float]) -> None:
        self.adapter, self.cfg, self.data, self.towers, self.score_fn = adapter, cfg, data, towers, score_fn
        self.dev = torch.device(cfg.device)
        params = [p for p in adapter.parameters() if p.requires_grad]
        groups: list[dict[str, Any]] = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": cfg.weight_decay},
                                        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
        if towers is not None:
            groups.append({"params": towers.parameters(), "weight_decay": 0.0, "lr_scale": towers.lr_scale})
            params = params + towers.parameters()
        self.params = params
        self.opt = torch.optim.AdamW(groups, lr=cfg.lr)
        self.n = len(data.img)
        self.steps_per_epoch = max(1, math.ceil(self.n / cfg.batch_size))
        self.total = self.steps_per_epoch * cfg.epochs
        self.warm = int(self.steps_per_epoch * cfg.warmup_epochs)
        self.best_state: dict[str, torch.Tensor] | None = None
        self.best_towers: dict[str, torch.Tensor] | None = None
        self.best_score, self.best_epoch, self.bad_epochs = -1.0, -1, 0
        self.history: list[dict[str, float]] = []
        self.t0, self.c0 = time.time(), time.process_time()
        self.step = 0
        self.gen = torch.Generator(device="cpu").manual_seed(cfg.seed)
        self.ema = {k: v.detach().clone() for k, v in adapter.state_dict().items()} if cfg.ema_decay > 0 else None

    def lr_at(self, step: int) -> float:
        cfg = self.cfg
        if step < self.warm:
            return cfg.lr * (step + 1) / max(1, self.warm)
        prog = (step - self.warm) / max(1, self.total - self.warm)
        return cfg.lr * 0.5 * (1 + math.cos(math.pi * prog))

    def epoch(self, epoch: int, val: PairSet) -> dict[str, float]:
        """One pass over the training rows, then validation; returns the epoch's log row."""
        self.adapter.train()
        perm = torch.randperm(self.n, generator=self.gen).to(self.dev)
        sums: dict[str, float] = {}
        for s in range(0, self.n, self.cfg.batch_size):
            for k, v in self.train_step(perm[s:s + self.cfg.batch_size]).items():
                sums[k] = sums.get(k, 0.0) + v
        return self.validate(epoch, val, sums)

    def batch_rows(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                      torch.Tensor | None]:
        """The step's rows (with hard negatives pulled in), their photo (or an augmented view),
        title, group, and which photos are hidden."""
        d, cfg, gen, dev = self.data, self.cfg, self.gen, self.dev
        if d.hard is not None:
            # Pull each row's hard negatives into the batch so the loss must separate them.
            extra_rows = d.hard[idx[: len(idx) // 4]].flatten()
            idx = torch.unique(torch.cat([idx, extra_rows[extra_rows >= 0]]))
        bi, bt, bg = d.img[idx], d.txt[idx], d.grp[idx]
        if d.views is not None and d.view_ok is not None and cfg.view_prob > 0:
            # Feature-level augmentation: some rows see an augmented view of their photo.
            v = torch.randint(0, len(d.views), (len(idx),), generator=gen).to(dev)
            use = (torch.rand(len(idx), generator=gen) < cfg.view_prob).to(dev)
            use = use & d.view_ok[v, idx]
            bi = torch.where(use[:, None], d.views[v, idx], bi)
        hide = torch.rand(len(idx), generator=gen).to(dev) < cfg.modality_dropout if cfg.modality_dropout > 0 else None
        if self.towers is not None:  # the step's rows through the towers' deltas (with grad)
            bi, bt = self.towers.batch(idx, bi, bt)
        return idx, bi, bt, bg, hide

    def train_step(self, idx: torch.Tensor) -> dict[str, float]:
        adapter, cfg = self.adapter, self.cfg
        for g in self.opt.param_groups:
            g["lr"] = self.lr_at(self.step) * g.get("lr_scale", 1.0)
        idx, bi, bt, bg, hide = self.batch_rows(idx)
        scale = adapter.logit_scale.exp().clamp(max=100.0)
        if self.data.text_only:  # products as the engine indexes them without a photo: the text token alone
            out = adapter(None, bt)
            var = adapter(None, bi)
            loss = contrastive_loss(var.text, out.text, bg, bg, scale)
            if var.aux.get("loss") is not None:  # the variants' routing is balanced too
                loss = loss + cfg.aux_weight * var.aux["loss"]
        else:
            out = adapter.training_forward(bi, bt, hide_image=hide) if isinstance(adapter, CrossModalMoE) \
                else adapter(bi, bt)
            assert out.text is not None and out.image is not None  # both modalities went in
            loss = contrastive_loss(out.text, out.image, bg, bg, scale)
        parts = {"contrastive": loss.item()}
        if "fused" in out.aux.get("train_terms", ()) and not self.data.text_only:
            lf = contrastive_loss(out.text, out.fused, bg, bg, scale)
            loss = loss + 0.5 * lf
            parts["fused"] = lf.item()
        lq = self.query_loss(idx, out, scale)
        if lq is not None:
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
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.opt.step()
        if isinstance(adapter, CrossModalMoE):  # the MoE gate's loss-free load balancing
            adapter.after_step(out.aux)
        self.update_ema()
        self.step += 1
        return parts

    def query_loss(self, idx: torch.Tensor, out: Any, scale: torch.Tensor) -> torch.Tensor | None:
        """Pseudo-queries whose product is in this batch; every batch product that matches the
        query's attributes is a positive."""
        if self.data.queries is None:
            return None
        q_rows, q_txt, q_sub, q_key, p_keys = self.data.queries
        cfg, text_only = self.cfg, self.data.text_only
        inb = torch.zeros(self.n, dtype=torch.bool, device=self.dev)
        inb[idx] = True
        sel = inb[q_rows].nonzero().flatten()
        if len(sel) > cfg.batch_size:
            sel = sel[torch.randperm(len(sel), generator=self.gen)[: cfg.batch_size].to(self.dev)]
        if not len(sel):
            return None
        qo = self.adapter(None, self.towers.queries(sel, q_txt[sel]) if self.towers is not None else q_txt[sel])
        pos = p_keys[q_sub[sel]][:, idx] == q_key[sel][:, None]
        target = out.text if text_only else out.fused if "fused" in out.aux.get("train_terms", ()) else out.image
        lq = multi_positive_ce(scale * qo.text @ target.t(), pos)
        if cfg.text_text_weight > 0 and not text_only:
            lq = lq + cfg.text_text_weight * multi_positive_ce(scale * qo.text @ out.text.t(), pos)
        return lq

    def update_ema(self) -> None:
        if self.ema is None:
            return
        with torch.no_grad():
            for k, v in self.adapter.state_dict().items():
                if v.is_floating_point():
                    self.ema[k].lerp_(v, 1.0 - self.cfg.ema_decay)
                else:
                    self.ema[k].copy_(v)

    def validate(self, epoch: int, val: PairSet, sums: dict[str, float]) -> dict[str, float]:
        """Score the epoch's weights (the EMA's, when kept) on val; keep them if they are the best."""
        adapter, towers = self.adapter, self.towers
        live: dict[str, torch.Tensor] | None = None
        if self.ema is not None:  # validate (and keep) the averaged weights
            live = {k: v.detach().clone() for k, v in adapter.state_dict().items()}
            adapter.load_state_dict(self.ema)
        metrics = evaluate_pairs(adapter, towers.refresh(val, "val") if towers is not None else val, self.cfg.device)
        score = self.score_fn(metrics)
        row = {"epoch": epoch, **{f"loss_{k}": v / self.steps_per_epoch for k, v in sums.items()}, **metrics,
               "score": score, "lr": self.lr_at(self.step - 1), "seconds": time.time() - self.t0,
               "cpu_seconds": time.process_time() - self.c0}
        self.history.append(row)
        log.info("epoch %d %s", epoch, {k: round(v, 4) for k, v in row.items() if isinstance(v, float)})
        if score > self.best_score:
            self.best_score, self.best_epoch, self.bad_epochs = score, epoch, 0
            self.best_state = {k: v.detach().clone() for k, v in adapter.state_dict().items()}
            self.best_towers = towers.state() if towers is not None else None
        else:
            self.bad_epochs += 1
        if live is not None:
            adapter.load_state_dict(live)
        return row

    def finish(self, train: PairSet) -> TrainResult:
        """Back to the best weights; settle the routing balance on the training tokens."""
        adapter, towers, dev = self.adapter, self.towers, self.dev
        img, txt = self.data.img, self.data.txt
        if self.best_state is not None:
            adapter.load_state_dict(self.best_state)
        if towers is not None and self.best_towers is not None:
            towers.load_state(self.best_towers)
            adapted = towers.refresh(train, "train")  # the balance settles on the adapted tokens
            img, txt = torch.from_numpy(adapted.image).to(dev), torch.from_numpy(adapted.text).to(dev)
        balance: dict[str, float] = {}
        if isinstance(adapter, CrossModalMoE):
            balance = adapter.calibrate_balance(None if self.data.text_only else img, txt)
            if balance:
                log.info("routing balance on the training tokens: %s", balance)
        adapter.eval()
        adapter.config["train"] = {"config": asdict(self.cfg), "best_epoch": self.best_epoch,
                                   "val_score": self.best_score, **({"balance": balance} if balance else {})}
        return TrainResult(best_epoch=self.best_epoch, best_score=self.best_score, history=self.history,
                           seconds=time.time() - self.t0)
