"""Cross-modal mixture-of-experts gate: frozen photo and text features -> one shared space.

Every input vector is a *token*: a product's photo features, a product's title features, or a
query (text, photo or both). A token is projected into a common width by its modality's input
projection, then

- a router over ``experts`` experts reads the cross-modal features: the token's own projection,
  the other modality's projection when the same product/query has it (else a learned
  placeholder), and a modality flag; it keeps the ``top_k`` best experts and renormalises their
  weights (during training: noisy top-k, the noise learned per expert, as in Shazeer et al. 2017);
  with ``dynamic_k`` a confident route (top weight >= ``dynamic_threshold``) uses one expert;
- the chosen experts (small MLPs) map the token into the shared space (``dim``, default 256),
  added to a linear skip path and L2-normalised;
- a modality gate weighs a product's photo and text embeddings per product (a sigmoid of a small
  MLP over both); a product without a photo or without text is its one embedding.

Auxiliary losses: Switch-Transformer load balancing (E * sum_e f_e * P_e) and the router z-loss
(mean squared log-sum-exp of the router logits). With ``balance="bias"`` (the default) the load is
also evened out without a loss, as in DeepSeek-V3's auxiliary-loss-free balancing: a per-expert
bias is added to the router logits *for choosing* the top-k experts only (the mixing weights stay
the router's own probabilities); after every training step each bias moves by ``bias_rate``
towards the experts that lone tokens (photos and texts routed alone, as they are indexed and
queried) under-use, and a last calibration over the training tokens settles it (stopping as soon
as their load CV is under ``balance_target_cv``, so as few tokens as possible change experts). The
bias is a buffer saved with the weights. :meth:`routing_stats` reports per-expert load, its
coefficient of variation, routing entropy, experts never chosen and experts per token.

At inference the input projections and experts read float16 copies of their weights
(``query_precision="float16"``, the default; :mod:`vitrine.encoders.moe_serving`).
At inference a batch's photo and text tokens are routed in one call and each chosen expert runs
once, on every token that chose it (a query's photo and its text often share experts).

``forward_light`` is the degraded path (vitrine/search/fallback.py): the skip path plus an even
mix of all experts, with no router.
"""

from __future__ import annotations

import math
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from vitrine.encoders.adapter_base import Adapter, AdapterOutput
from vitrine.encoders.moe_serving import HalfWeights
from vitrine.errors import ModelError

IMAGE, TEXT = 0, 1


def _linear_at(seq: nn.Sequential, i: int) -> nn.Linear:
    """Item ``i`` of a Sequential built here with a Linear there (Sequential types items as Module)."""
    return cast(nn.Linear, seq[i])


class _Expert(nn.Module):
    def __init__(self, width: int, hidden: int, dim: int, dropout: float) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def linears(self) -> tuple[nn.Linear, nn.Linear]:
        """The MLP's two Linear layers."""
        return _linear_at(self.net, 0), _linear_at(self.net, 3)


class CrossModalMoE(Adapter):
    """The cross-modal MoE gate (see the module docstring). Config: ``experts`` (8), ``top_k``
    (2), ``width`` (512, the common token width), ``hidden`` (512, per expert), ``dim`` (256),
    ``dropout``, ``router_noise`` (noisy top-k during training), ``dynamic_k``,
    ``dynamic_threshold``, ``balance_weight``, ``z_weight``, ``balance`` ("bias" or "loss"),
    ``bias_rate``, ``balance_target_cv``, ``input_dropout`` (on the projected tokens, training
    only), ``query_precision`` ("float16", the default, or "float32": the inference weights),
    ``cross_dropout`` (chance that the router does not see the other modality during training, so
    lone photos and lone texts route as well as pairs)."""

    kind = "moe"
    route_bias: torch.Tensor  # a buffer (register_buffer)

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        c = self.config
        self.experts_n = int(c.setdefault("experts", 8))
        self.top_k = int(c.setdefault("top_k", 2))
        if not 1 <= self.top_k <= self.experts_n:
            raise ModelError(f"top_k must be between 1 and experts ({self.experts_n}), not {self.top_k}")
        width = int(c.setdefault("width", 512))
        hidden = int(c.setdefault("hidden", 512))
        dropout = float(c.setdefault("dropout", 0.1))
        self.router_noise = bool(c.setdefault("router_noise", True))
        self.dynamic_k = bool(c.setdefault("dynamic_k", False))
        self.dynamic_threshold = float(c.setdefault("dynamic_threshold", 0.7))
        self.balance_weight = float(c.setdefault("balance_weight", 0.05))
        self.z_weight = float(c.setdefault("z_weight", 1e-3))
        self.cross_dropout = float(c.setdefault("cross_dropout", 0.5))
        self.balance = str(c.setdefault("balance", "bias"))
        if self.balance not in ("bias", "loss"):
            raise ModelError(f"balance must be 'bias' or 'loss', not {self.balance!r}")
        self.bias_rate = float(c.setdefault("bias_rate", 0.01))
        self.target_cv = float(c.setdefault("balance_target_cv", 0.05))
        self.input_dropout = nn.Dropout(float(c.setdefault("input_dropout", 0.0)))  # training only
        self.query_precision = str(c.setdefault("query_precision", "float16"))
        if self.query_precision not in ("float32", "float16"):
            raise ModelError(f"query_precision must be 'float32' or 'float16', not {self.query_precision!r}")
        self._half = HalfWeights(self._half_layers)  # float16 copies (queries)
        self.image_in = nn.Sequential(nn.Linear(self.image_dim, width), nn.LayerNorm(width))
        self.text_in = nn.Sequential(nn.Linear(self.text_dim, width), nn.LayerNorm(width))
        self.placeholder = nn.Parameter(torch.zeros(2, width))  # [missing photo, missing text]
        self.flag = nn.Embedding(2, width)  # which modality the token is
        self.router = nn.Linear(3 * width, self.experts_n)
        self.noise = nn.Linear(3 * width, self.experts_n)
        nn.init.normal_(self.router.weight, std=0.02)
        nn.init.zeros_(self.noise.weight)
        self.skip = nn.Linear(width, self.dim)
        self.experts = nn.ModuleList(_Expert(width, hidden, self.dim, dropout) for _ in range(self.experts_n))
        self.gate = nn.Sequential(nn.Linear(3 * self.dim, 64), nn.GELU(), nn.Linear(64, 1))
        # Added to the logits when choosing experts (balance="bias"); zeros otherwise.
        self.register_buffer("route_bias", torch.zeros(self.experts_n))
        self.gumbel_tau = 0.0  # > 0 while training: straight-through Gumbel-softmax routing

    def set_training_routing(self, *, gumbel_tau: float = 0.0) -> None:
        """How the router picks experts while training: noisy top-k (``gumbel_tau`` 0, the default)
        or straight-through Gumbel-softmax at temperature ``gumbel_tau`` (the top-k of the
        Gumbel-perturbed logits run; the gradient reaches the router through the whole softmax).
        Inference is the same either way: the clean top-k."""
        if gumbel_tau < 0:
            raise ModelError(f"gumbel_tau must be >= 0, not {gumbel_tau}")
        self.gumbel_tau = float(gumbel_tau)

    def train(self, mode: bool = True) -> CrossModalMoE:
        self._half.clear()  # weights may change: the float16 query copies are made again when needed
        return super().train(mode)

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> CrossModalMoE:
        self._half.clear()
        return super()._apply(fn, *args, **kwargs)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        self._half.clear()
        # Gates saved before the choice bias existed load with a zero bias (their own routing).
        state_dict.setdefault(prefix + "route_bias", torch.zeros(self.experts_n))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    # -- tokens and routing --------------------------------------------------------------------
    def _project(self, image: torch.Tensor | None, text: torch.Tensor | None
                 ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        pi = pt = None
        if image is not None:
            pi = self.image_in[1](self._linear("image", _linear_at(self.image_in, 0), self.norm_image(image.float())))
        if text is not None:
            pt = self.text_in[1](self._linear("text", _linear_at(self.text_in, 0), self.norm_text(text.float())))
        if self.training:
            pi = self.input_dropout(pi) if pi is not None else None
            pt = self.input_dropout(pt) if pt is not None else None
        return pi, pt

    def _route_input(self, own: torch.Tensor, other: torch.Tensor | None, modality: int) -> torch.Tensor:
        n = own.shape[0]
        if other is None:
            other = self.placeholder[1 - modality].expand(n, -1)
        flag = self.flag.weight[modality].expand(n, -1)
        img, txt = (own, other) if modality == IMAGE else (other, own)
        return torch.cat([img, txt, flag], dim=-1)

    def _route(self, r_in: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Router logits, the dense weight matrix (zeros off the chosen experts) and the mask
        of chosen experts."""
        return self._route_logits(self.router(r_in), r_in)

    def _route_logits(self, logits: torch.Tensor, r_in: torch.Tensor | None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        noisy = logits
        gumbel = self.training and self.gumbel_tau > 0 and r_in is not None
        if gumbel:
            noisy = logits - torch.empty_like(logits).exponential_().log()  # + Gumbel(0, 1) noise
        elif self.training and self.router_noise and r_in is not None:
            noisy = logits + torch.randn_like(logits) * F.softplus(self.noise(r_in))
        probs = F.softmax(noisy / self.gumbel_tau if gumbel else noisy, dim=-1)
        _, top_i = (noisy.detach() + self.route_bias).topk(self.top_k, dim=-1)
        top_w = probs.gather(1, top_i)
        if self.dynamic_k and self.top_k > 1:  # a confident route keeps its first expert only
            keep = torch.ones_like(top_w, dtype=torch.bool)
            keep[:, 1:] = (top_w[:, 0] < self.dynamic_threshold)[:, None]
            top_w = torch.where(keep, top_w, torch.zeros_like(top_w))
        top_w = top_w / top_w.sum(-1, keepdim=True).clamp_min(1e-9)
        weights = torch.zeros_like(probs).scatter(1, top_i, top_w)
        chosen = weights > 0
        if gumbel:  # straight-through: the chosen weights forward, the whole softmax's gradient back
            weights = weights + (probs - probs.detach())
        return logits, weights, chosen

    def _experts_out(self, x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Skip path plus each token's weighted experts, L2-normalised; every chosen expert runs
        once, on the rows that chose it."""
        out = self.skip(x)
        chosen = (weights > 0).t()  # (experts, tokens)
        for e in chosen.any(1).nonzero().flatten().tolist():
            rows = chosen[e].nonzero().flatten()
            if len(rows) == len(x):  # every token (always so for a lone query): no gather or scatter
                out = out + weights[:, e, None] * self._expert(e, x)
            else:
                out = out.index_add(0, rows, weights[rows, e, None] * self._expert(e, x[rows]))
        return F.normalize(out, dim=-1)

    def _infer(self, pi: torch.Tensor | None, pt: torch.Tensor | None
               ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Inference (no noise, no auxiliary losses) for any batch: the photo and text tokens, each
        seeing the other, are routed by one router call and go through the experts together."""
        # one photo or one text: a lone query, as served
        if pt is None and pi is not None and pi.shape[0] == 1:
            return self._infer_one(pi, IMAGE), None
        if pi is None and pt is not None and pt.shape[0] == 1:
            return None, self._infer_one(pt, TEXT)
        tokens = [(m, own, other) for m, own, other in ((IMAGE, pi, pt), (TEXT, pt, pi)) if own is not None]
        r_in = torch.cat([self._route_input(own, other, m) for m, own, other in tokens])
        out = self._experts_out(torch.cat([own for _, own, _ in tokens]),
                                self._route_logits(self.router(r_in), None)[1])
        n = out.shape[0] // len(tokens)
        return (out[:n] if pi is not None else None), (out[-n:] if pt is not None else None)

    def _infer_one(self, own: torch.Tensor, modality: int) -> torch.Tensor:
        """:meth:`_infer` for one token routed alone (a text-only or photo-only query), with the
        same arithmetic in the same order but none of the batch bookkeeping (masks, gathers,
        scatters), about a tenth of a lone query's time in the gate (`vitrine bench gate`).
        tests/test_moe.py checks it against the batched path."""
        logits = self.router(self._route_input(own, None, modality))
        probs = F.softmax(logits, dim=-1)
        top_i = (logits + self.route_bias).topk(self.top_k, dim=-1).indices[0]
        top_w = probs[0, top_i]
        if self.dynamic_k and self.top_k > 1 and float(top_w[0]) >= self.dynamic_threshold:
            top_i, top_w = top_i[:1], top_w[:1]
        top_w = top_w / top_w.sum().clamp_min(1e-9)
        out = self.skip(own)
        order = top_i.argsort()  # ascending expert number, as the batched path adds them
        for e, w in zip(top_i[order].tolist(), top_w[order].unbind()):
            out = out + w * self._expert(e, own)
        return F.normalize(out, dim=-1)

    def _half_layers(self) -> dict[str, nn.Linear]:
        """The layers with float16 query copies: the input projections and the experts."""
        layers = {"image": _linear_at(self.image_in, 0), "text": _linear_at(self.text_in, 0)}
        for e, expert in enumerate(self.experts):
            layers[f"{e}.0"], layers[f"{e}.1"] = cast(_Expert, expert).linears()
        return layers

    def _half_mode(self) -> bool:
        return not self.training and self.query_precision == "float16"

    def _linear(self, name: str, layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        """An input projection's matrix product: at inference in ``query_precision`` (the output
        is float32 either way), in float32 while training."""
        if not self._half_mode():
            return F.linear(x, layer.weight, layer.bias)
        return self._half.linear(name, x)

    def _expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        if not self._half_mode():
            return self.experts[e](x)
        return self._half.mlp(f"{e}.0", f"{e}.1", x)

    def _token(self, own: torch.Tensor, other: torch.Tensor | None, modality: int,
               stats: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        logits, weights, chosen = self._route(self._route_input(own, other, modality))
        stats.append((logits, weights, chosen))
        return self._experts_out(own, weights)

    def _aux(self, stats: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> dict[str, Any]:
        logits = torch.cat([s[0] for s in stats])
        chosen = torch.cat([s[2] for s in stats]).float()
        probs = F.softmax(logits, dim=-1)
        frac = chosen.sum(0) / chosen.sum().clamp_min(1.0)  # share of assignments per expert
        balance = self.experts_n * (frac * probs.mean(0)).sum()
        z = torch.logsumexp(logits, dim=-1).pow(2).mean()
        loss = self.balance_weight * balance + self.z_weight * z
        return {"loss": loss, "balance": balance.detach(), "z": z.detach(), "load": frac.detach(),
                "train_terms": ("fused",)}

    # -- the adapter seam ----------------------------------------------------------------------
    def embed_image(self, x: torch.Tensor) -> torch.Tensor:
        return self(x, None).image

    def embed_text(self, x: torch.Tensor) -> torch.Tensor:
        return self(None, x).text

    def mix(self, image: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        """The modality gate: a per-product photo weight from both embeddings."""
        g = self.photo_weight(image, text)[:, None]
        return F.normalize(g * image + (1 - g) * text, dim=-1)

    def photo_weight(self, image: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        """The gate's photo weight per product."""
        return torch.sigmoid(self.gate(torch.cat([image, text, image * text], dim=-1))).squeeze(-1)

    def query_mix_logit(self, image: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        """For queries with a photo and words (their shared-space vectors, one query per row, as
        the engine holds them): the modality gate's logit of the photo's weight in the blend of
        the two scores (``query_photo_weight`` adds the offset tuned on val)."""
        return self.gate(torch.cat([image, text, image * text], dim=-1)).squeeze(-1)

    def query_photo_weight(self, image: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        """The photo's weight per photo + words query: the gate's logit plus ``query_mix_offset``
        (config: the offset the composed-query protocol tunes on val, docs/models.md)."""
        return torch.sigmoid(self.query_mix_logit(image, text) + float(self.config.get("query_mix_offset", 0.0)))

    def forward(self, image: torch.Tensor | None = None, text: torch.Tensor | None = None) -> AdapterOutput:
        """Both given: one product (or query) per row, each token routed seeing the other."""
        if image is None and text is None:
            raise ModelError("the MoE gate needs a photo, a text or both")
        if image is not None and text is not None and image.shape[0] != text.shape[0]:
            raise ModelError("photo and text batches differ in length")
        pi, pt = self._project(image, text)
        if not self.training:
            img, txt = self._infer(pi, pt)
            return AdapterOutput(image=img, text=txt, fused=self.fuse(img, txt))
        stats: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        img = self._token(pi, pt, IMAGE, stats) if pi is not None else None
        txt = self._token(pt, pi, TEXT, stats) if pt is not None else None
        return AdapterOutput(image=img, text=txt, fused=self.fuse(img, txt), aux=self._aux(stats))

    def training_forward(self, image: torch.Tensor, text: torch.Tensor, *,
                         hide_image: torch.Tensor | None = None) -> AdapterOutput:
        """A training batch of products: the router sometimes does not see the other modality
        (``cross_dropout``); rows in ``hide_image`` are products without a photo (their fused
        vector is their text alone and their text routes without it)."""
        pi, pt = self._project(image, text)
        assert pi is not None and pt is not None
        n = pi.shape[0]
        lone = torch.rand(n, device=pi.device) < self.cross_dropout
        hidden = hide_image if hide_image is not None else torch.zeros(n, dtype=torch.bool, device=pi.device)
        ph_t = self.placeholder[1].expand(n, -1)
        ph_i = self.placeholder[0].expand(n, -1)
        other_for_img = torch.where(lone[:, None], ph_t, pt)
        other_for_txt = torch.where((lone | hidden)[:, None], ph_i, pi)
        stats: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        img = self._token(pi, other_for_img, IMAGE, stats)
        txt = self._token(pt, other_for_txt, TEXT, stats)
        fused = self.fuse(img, txt)
        fused = torch.where(hidden[:, None], txt, fused)
        aux = self._aux(stats)
        # Routing agreement: symmetric KL between each product's photo and title routes.
        lp_i, lp_t = F.log_softmax(stats[0][0], dim=-1), F.log_softmax(stats[1][0], dim=-1)
        aux["route_kl"] = 0.5 * ((lp_i.exp() * (lp_i - lp_t)).sum(-1) + (lp_t.exp() * (lp_t - lp_i)).sum(-1)).mean()
        # The load of the tokens routed alone: what indexing and queries see, what the bias evens out.
        lone_chosen = torch.cat([stats[0][2][lone], stats[1][2][lone | hidden]]).float()
        aux["lone_load"] = (lone_chosen.sum(0) / lone_chosen.sum().clamp_min(1.0)).detach()
        return AdapterOutput(image=img, text=txt, fused=fused, aux=aux)

    # -- loss-free balancing -------------------------------------------------------------------
    @torch.no_grad()
    def after_step(self, aux: dict[str, Any]) -> None:
        """After a training step: move each expert's choice bias towards even load."""
        load = aux.get("lone_load")
        if self.balance != "bias" or self.bias_rate <= 0 or load is None:
            return
        self.route_bias += self.bias_rate * torch.sign(load.mean() - load)

    @torch.no_grad()
    def calibrate_balance(self, image: torch.Tensor | None, text: torch.Tensor | None, steps: int = 400,
                          batch: int = 8192) -> dict[str, float]:
        """Settle the choice bias on these (training) tokens routed alone, without noise: sign steps
        of shrinking size until their load CV is under ``balance_target_cv`` (else the lowest CV
        seen). Returns the CV before/after."""
        if self.balance != "bias":
            return {}
        was_training = self.training
        self.eval()
        z = self._lone_logits(image, text, batch)
        self.train(was_training)
        if not len(z):
            return {}

        def cv(bias: torch.Tensor) -> tuple[float, torch.Tensor]:
            idx = (z + bias).topk(self.top_k, dim=-1).indices
            load = torch.bincount(idx.flatten(), minlength=self.experts_n).float()
            load = load / load.sum()
            return float(load.std(unbiased=False) / load.mean()), load

        start, _ = cv(self.route_bias)
        best_bias, best = self.route_bias.clone(), start
        bias = self.route_bias.clone()
        scale = float(z.std()) if z.numel() > 1 else 1.0
        for i in range(steps):
            value, load = cv(bias)
            if value < best:
                best, best_bias = value, bias.clone()
            if best <= self.target_cv:  # the smallest move that is even enough: fewer re-routed tokens
                break
            rate = scale * 0.05 * (1.0 - i / steps) + 1e-4
            bias += rate * torch.sign(load.mean() - load)
        self.route_bias.copy_(best_bias)
        return {"load_cv_before": round(start, 4), "load_cv_after": round(best, 4)}

    def forward_light(self, image: torch.Tensor | None = None, text: torch.Tensor | None = None) -> AdapterOutput:
        """The degraded path: no router; the skip path plus an even mix of every expert."""
        pi, pt = self._project(image, text)

        def light(x: torch.Tensor) -> torch.Tensor:
            return self._experts_out(x, torch.full((x.shape[0], self.experts_n), 1.0 / self.experts_n,
                                                   device=x.device))

        img = light(pi) if pi is not None else None
        txt = light(pt) if pt is not None else None
        return AdapterOutput(image=img, text=txt, fused=self.fuse(img, txt))

    def _lone_logits(self, image: torch.Tensor | None, text: torch.Tensor | None, batch: int) -> torch.Tensor:
        """Router logits of these photos and texts, each routed alone (as indexed and queried);
        photos first. Call in eval mode."""
        out = []
        for x, modality in ((image, IMAGE), (text, TEXT)):
            if x is None:
                continue
            for s in range(0, len(x), batch):
                chunk = x[s:s + batch]
                pi, pt = self._project(chunk if modality == IMAGE else None, chunk if modality == TEXT else None)
                own = pi if modality == IMAGE else pt
                assert own is not None
                out.append(self.router(self._route_input(own, None, modality)))
        return torch.cat(out) if out else torch.zeros(0, self.experts_n)

    # -- statistics ------------------------------------------------------------------------------
    @torch.inference_mode()
    def routing_stats(self, image: torch.Tensor | None, text: torch.Tensor | None,
                      batch: int = 4096, *, pairs: bool = False) -> dict[str, Any]:
        """Routing of these tokens (photos and texts, each alone as at indexing and query time):
        per-expert load (share of assignments), its coefficient of variation, mean routing
        entropy (nats), experts never chosen, mean experts per token. With ``pairs`` (row i of
        ``image`` and of ``text`` are one product): ``pairs_sharing_an_expert``, the share of
        products whose photo and title choose at least one common expert (low: the experts split
        by modality rather than by what the product is); ``route_kl``, the mean symmetric KL
        between a product's photo and title routing distributions; ``pair_cosine``, the mean
        cosine of a product's photo and title in the shared space. ``utilisation_variance``: the
        variance of each expert's load relative to an even share (load x experts; 0 = even)."""
        self.eval()
        logits = self._lone_logits(image, text, batch)
        if not len(logits):
            raise ModelError("routing_stats needs photos or texts")
        _, _, chosen = self._route_logits(logits, None)
        extra: dict[str, float] = {}
        if pairs:
            if image is None or text is None or len(image) != len(text):
                raise ModelError("routing_stats(pairs=True) needs as many photos as texts, one product per row")
            n = len(image)
            extra["pairs_sharing_an_expert"] = round(float((chosen[:n] & chosen[n:]).any(1).float().mean()), 4)
            lp = F.log_softmax(logits, dim=-1)
            lp_i, lp_t = lp[:n], lp[n:]
            kl = 0.5 * ((lp_i.exp() * (lp_i - lp_t)).sum(-1) + (lp_t.exp() * (lp_t - lp_i)).sum(-1))
            extra["route_kl"] = round(float(kl.mean()), 4)
            cos = [float((self(image[s:s + batch], None).image * self(None, text[s:s + batch]).text).sum(-1).sum())
                   for s in range(0, n, batch)]
            extra["pair_cosine"] = round(sum(cos) / n, 4)
        chosen = chosen.float()
        p = F.softmax(logits, dim=-1)
        entropy = -(p * p.clamp_min(1e-12).log()).sum(-1)
        load = chosen.sum(0) / chosen.sum()
        mean = float(load.mean())
        return {
            "experts": self.experts_n, "top_k": self.top_k, "dynamic_k": self.dynamic_k, "tokens": int(len(chosen)),
            "load": [round(float(v), 4) for v in load],
            "load_cv": round(float(load.std(unbiased=False)) / mean, 4) if mean > 0 else math.inf,
            "utilisation_variance": round(float((load * self.experts_n).var(unbiased=False)), 4),
            "entropy": round(float(entropy.mean()), 4),
            "max_entropy": round(math.log(self.experts_n), 4),
            "dead_experts": [i for i, v in enumerate(load.tolist()) if v == 0.0],
            "experts_per_token": round(float(chosen.sum(1).mean()), 3),
            **extra,
        }
