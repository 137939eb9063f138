"""Composed queries: a product's photo plus words naming one changed attribute.

A shopper shows a photo and says how the product should differ: "in red", "for men", "for sports",
"in leather". Built from a split's products P (seeded): the photo of P plus words naming a new
value of one attribute P has (colour, gender, usage, or a material its title names), a value that
at least ``min_relevant`` other products of P's article type carry. Relevant = every product of
P's article type carrying the new value (the whole catalogue is the gallery).

Ranked like the engine ranks a photo + text query: the photo's vector against product photo
vectors, the words' vector against fused product vectors, blended as ``w * photo + (1 - w) *
words``. Rows of the report:

- ``photo`` (photo-only) and ``text`` (the words alone): the single-modality baselines;
- ``served``: the engine's fixed blend today (``Settings.query_image_weight``);
- ``gate``: the photo weight decided per query by the MoE's modality gate over the photo's and
  the words' vectors (``query_mix_logit``); one offset on the gate's logit is tuned on the val
  split (never on the split reported).

Metrics: R@10 (BEIR recall: share of the relevant products in the top 10), P@10, nDCG@10.
"""

from __future__ import annotations

import logging
import random
import re
from collections import Counter
from typing import Any

import numpy as np
import torch

from vitrine.encoders.encoder import MultimodalEncoder
from vitrine.encoders.moe import CrossModalMoE
from vitrine.evals.datasets import Catalog
from vitrine.metrics import mean_metrics

log = logging.getLogger(__name__)

KINDS = ("colour", "gender", "usage", "material")
MATERIALS = ("leather", "suede", "canvas", "denim", "cotton", "linen", "silk", "satin", "wool", "woollen", "velvet",
             "nylon", "polyester", "mesh", "knit", "lace", "chiffon", "georgette", "crepe", "rubber", "steel",
             "metal", "plastic", "gold", "silver", "brass", "wooden", "jute")
_MATERIAL_RE = re.compile(r"\b(" + "|".join(MATERIALS) + r")\b", re.I)
_SKIP_VALUES = {"", "na", "nan", "multi", "none"}
GATE_OFFSETS = (-3.0, -2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0)
FIXED_WEIGHTS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)


def material_of(title: str) -> str | None:
    m = _MATERIAL_RE.search(title)
    return m.group(1).lower() if m else None


def attribute_value(row: dict[str, str], kind: str) -> str | None:
    if kind == "material":
        return material_of(row["productDisplayName"])
    v = row.get({"colour": "baseColour", "gender": "gender", "usage": "usage"}[kind], "") or ""
    return None if v.strip().lower() in _SKIP_VALUES else v.strip()


def words_for(kind: str, value: str) -> str:
    """How a shopper names the change: "in red", "for men", "for sports", "in leather"."""
    v = value.lower()
    if kind in ("colour", "material"):
        return f"in {v}"
    if kind == "gender":
        return "unisex" if v == "unisex" else f"for {v}"
    return f"for {v}" if v in ("sports", "travel", "home", "party") else f"for {v} wear"


def composed_queries(catalog: Catalog, split: str, *, n: int = 400, seed: int = 3, min_relevant: int = 3,
                     has_photo: np.ndarray | None = None) -> list[dict[str, Any]]:
    """Queries ``{row, kind, old, new, words, relevant: [rows]}`` seeded by ``split``'s products."""
    rows = catalog.rows
    has_photo = np.ones(len(rows), dtype=bool) if has_photo is None else has_photo
    by_type: dict[str, dict[str, dict[str, list[int]]]] = {}
    for i, r in enumerate(rows):
        if not has_photo[i]:
            continue
        for kind in KINDS:
            v = attribute_value(r, kind)
            if v is not None:
                by_type.setdefault(r["articleType"], {}).setdefault(kind, {}).setdefault(v, []).append(i)
    rng = random.Random(seed)
    seeds = [i for i in np.flatnonzero(catalog.split_mask(split) & has_photo).tolist()]
    rng.shuffle(seeds)
    out: list[dict[str, Any]] = []
    turn = 0
    for i in seeds:
        if len(out) >= n:
            break
        r = rows[i]
        for step in range(len(KINDS)):
            kind = KINDS[(turn + step) % len(KINDS)]
            old = attribute_value(r, kind)
            if old is None:
                continue
            values = by_type.get(r["articleType"], {}).get(kind, {})
            new = sorted(v for v, members in values.items() if v != old and len(members) >= min_relevant)
            if not new:
                continue
            value = rng.choice(new)
            out.append({"row": i, "kind": kind, "old": old, "new": value, "words": words_for(kind, value),
                        "relevant": [j for j in values[value] if j != i]})
            turn += 1
            break
    return out


class _Gallery:
    """The catalogue's product vectors as the engine indexes them: photo and fused."""

    @torch.inference_mode()
    def __init__(self, encoder: MultimodalEncoder, catalog: Catalog) -> None:
        img_f, txt_f = catalog.features(encoder, progress=False)
        self.img_f, self.txt_f = img_f, txt_f
        self.has_img = ~np.isnan(img_f).any(1)
        emb = encoder.embed(img_f, txt_f)
        self.fused = torch.from_numpy(emb.fused)
        image = np.zeros_like(emb.fused)
        image[self.has_img] = encoder.embed(img_f[self.has_img], None).image
        self.image = torch.from_numpy(image)


def _query_parts(encoder: MultimodalEncoder, g: _Gallery, qs: list[dict[str, Any]]
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(photo vectors, words vectors, the gate's photo-weight logit per query or None)."""
    img_f = g.img_f[[q["row"] for q in qs]]
    words_f = encoder.text_features([q["words"] for q in qs])
    adapter = encoder.adapter
    with torch.inference_mode():
        lone_i = torch.from_numpy(encoder.embed(img_f, None).image)
        lone_t = torch.from_numpy(encoder.embed(None, words_f).text)
        logit = adapter.query_mix_logit(lone_i, lone_t) if isinstance(adapter, CrossModalMoE) else None
    return lone_i, lone_t, logit


def _rank(g: _Gallery, qi: torch.Tensor, qt: torch.Tensor, w: torch.Tensor, k: int = 10) -> list[list[int]]:
    """Top k products by ``w * photo->photo + (1 - w) * words->fused`` (w per query)."""
    out: list[list[int]] = []
    has = torch.from_numpy(g.has_img)
    for s in range(0, len(qi), 256):
        si = qi[s:s + 256] @ g.image.T
        si[:, ~has] = 0.0
        st = qt[s:s + 256] @ g.fused.T
        ww = w[s:s + 256, None]
        out += (ww * si + (1 - ww) * st).topk(k, dim=1).indices.tolist()
    return out


def _metrics(top: list[list[int]], qs: list[dict[str, Any]]) -> dict[str, float]:
    runs = [(t, {j: 1.0 for j in q["relevant"]}) for t, q in zip(top, qs)]
    m = mean_metrics(runs, [10], ("R", "P", "nDCG"))
    return {key: round(float(m[key]), 4) for key in ("R@10", "P@10", "nDCG@10")}


def _score(m: dict[str, float]) -> float:
    return m["nDCG@10"]


def composed_eval(encoder: MultimodalEncoder, catalog: Catalog, *, split: str = "test", n: int = 400,
                  served_weight: float = 0.5, tune_split: str = "val", seed: int = 3) -> dict[str, Any]:
    """The composed-query protocol (module docstring): the gate's offset and the best fixed
    weight are chosen on ``tune_split`` (nDCG@10); every row is then measured on ``split``."""
    g = _Gallery(encoder, catalog)

    def rows_for(sp: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        qs = composed_queries(catalog, sp, n=n, seed=seed, has_photo=g.has_img)
        qi, qt, logit = _query_parts(encoder, g, qs)
        ones = torch.ones(len(qs))
        res: dict[str, Any] = {
            "photo": _metrics(_rank(g, qi, qt, ones), qs),
            "text": _metrics(_rank(g, qi, qt, 0 * ones), qs),
            "served": _metrics(_rank(g, qi, qt, served_weight * ones), qs),
            "fixed": {w: _metrics(_rank(g, qi, qt, w * ones), qs) for w in FIXED_WEIGHTS},
        }
        if logit is not None:
            res["gate"] = {b: _metrics(_rank(g, qi, qt, torch.sigmoid(logit + b)), qs) for b in GATE_OFFSETS}
            res["gate_weights"] = {b: round(float(torch.sigmoid(logit + b).mean()), 3) for b in GATE_OFFSETS}
        return qs, res

    _, tune = rows_for(tune_split)
    best_w = max(FIXED_WEIGHTS, key=lambda w: _score(tune["fixed"][w]))
    best_b = max(GATE_OFFSETS, key=lambda b: _score(tune["gate"][b])) if "gate" in tune else None
    qs, test = rows_for(split)
    rows = {"photo": test["photo"], "text": test["text"], f"served (w={served_weight})": test["served"],
            f"fixed (w={best_w}, tuned on {tune_split})": test["fixed"][best_w]}
    if best_b is not None:
        rows[f"gate (offset {best_b}, tuned on {tune_split})"] = test["gate"][best_b]
    composed_key = max((k for k in rows if k.startswith(("gate", "fixed"))),
                       key=lambda k: _score(tune["gate"][best_b] if k.startswith("gate") else tune["fixed"][best_w]))
    kinds = Counter(q["kind"] for q in qs)
    per_kind: dict[str, dict[str, dict[str, float]]] = {}
    for kind in kinds:
        sel = [j for j, q in enumerate(qs) if q["kind"] == kind]
        sub = [qs[j] for j in sel]
        qi, qt, logit = _query_parts(encoder, g, sub)
        ones = torch.ones(len(sub))
        if logit is not None and best_b is not None and composed_key.startswith("gate"):
            w = torch.sigmoid(logit + best_b)
        else:
            w = best_w * ones
        per_kind[kind] = {"photo": _metrics(_rank(g, qi, qt, ones), sub), "text": _metrics(_rank(g, qi, qt, 0 * ones), sub),
                          "composed": _metrics(_rank(g, qi, qt, w), sub)}
    composed = rows[composed_key]
    beats = all(composed[m] > max(rows["photo"][m], rows["text"][m]) for m in ("R@10", "nDCG@10"))
    return {
        "protocol": "composed", "split": split, "tuned_on": tune_split, "queries": len(qs), "kinds": dict(kinds),
        "gallery": int(g.has_img.sum()), "composed": composed_key, "metrics": composed,
        "rows": rows, "per_kind": per_kind, "beats_both": beats,
        "tuning": {"fixed": {str(w): tune["fixed"][w] for w in FIXED_WEIGHTS},
                   "gate": {str(b): tune["gate"][b] for b in GATE_OFFSETS} if "gate" in tune else {},
                   "gate_mean_photo_weight": {str(b): v for b, v in tune.get("gate_weights", {}).items()}},
        "examples": [{"title": catalog.rows[q["row"]]["productDisplayName"], "words": q["words"],
                      "relevant": len(q["relevant"])} for q in qs[:5]],
    }
