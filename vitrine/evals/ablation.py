"""The alignment ablation: every adapter kind on the same test split, one table.

Rows: a no-adapter baseline (ConSE: a photo is the probability-weighted mean of the text-tower
embeddings of its top ImageNet classes, from the image tower's own ImageNet head), the plain
text tower (text-only rows), and any trained adapters (linear, MLP, MoE with E experts and top-k).
Columns, all exact search over cached backbone features (no index, no fusion):

- KAGL title -> image over every photo of the catalogue: R@1, R@10, MRR@10 (test-split titles);
- sub-category name -> product (fused product vector): P@1, P@10;
- attribute queries ("women red heels") -> product (fused vectors of every product): nDCG@10, R@10;
- the same attribute queries against a text-only catalogue (titles only, no photos): nDCG@10,
  beside the plain text tower's own embeddings (a merchant's text-only feed must not get worse).

Metrics are the pure functions of :mod:`vitrine.metrics`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from vitrine.encoders.adapter_base import Adapter
from vitrine.encoders.adapters import load_adapter, parse_adapter_spec
from vitrine.encoders.encoder import MultimodalEncoder
from vitrine.encoders.moe import CrossModalMoE
from vitrine.errors import MissingExtra, ModelError
from vitrine.evals import attribute_queries as aq
from vitrine.evals.datasets import Catalog
from vitrine.metrics import mean_metrics
from vitrine.evals.plotting import pyplot

log = logging.getLogger(__name__)

CONSE_TOP = 10
COLUMNS = ("kagl_R@1", "kagl_R@10", "kagl_MRR@10", "subcat_P@1", "subcat_P@10", "attr_nDCG@10", "attr_R@10",
           "textonly_attr_nDCG@10")


def _norm(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True).clip(1e-12)


def _topk(q: np.ndarray, g: np.ndarray, k: int) -> list[list[int]]:
    gt = torch.from_numpy(np.ascontiguousarray(g, dtype=np.float32))
    out: list[list[int]] = []
    for s in range(0, len(q), 1024):
        qq = torch.from_numpy(np.ascontiguousarray(q[s:s + 1024], dtype=np.float32))
        out += (qq @ gt.T).topk(min(k, len(g)), dim=1).indices.tolist()
    return out


class Embedder:
    """One row of the table: how photos, texts and products become vectors."""

    def __init__(self, name: str, image: Callable[[np.ndarray], np.ndarray] | None,
                 text: Callable[[np.ndarray], np.ndarray], fused: Callable[[np.ndarray, np.ndarray], np.ndarray] | None,
                 info: dict[str, Any] | None = None) -> None:
        self.name, self.image, self.text, self.fused = name, image, text, fused
        self.info = info or {}
        self.adapter: Adapter | None = None


def adapter_embedder(name: str, adapter: Adapter) -> Embedder:
    adapter.eval()

    @torch.inference_mode()
    def run(img: np.ndarray | None, txt: np.ndarray | None) -> Any:
        outs = []
        given = img if img is not None else txt
        if given is None:
            raise ValueError("an embedder needs photos or texts")
        n = len(given)
        for s in range(0, n, 4096):
            i = torch.from_numpy(img[s:s + 4096]) if img is not None else None
            t = torch.from_numpy(txt[s:s + 4096]) if txt is not None else None
            outs.append(adapter(i, t))
        return outs

    def image(x: np.ndarray) -> np.ndarray:
        return np.concatenate([o.image.numpy() for o in run(x, None)])

    def text(x: np.ndarray) -> np.ndarray:
        return np.concatenate([o.text.numpy() for o in run(None, x)])

    def fused(i: np.ndarray, t: np.ndarray) -> np.ndarray:
        return np.concatenate([o.fused.numpy() for o in run(i, t)])

    info = {"kind": adapter.kind, "parameters": sum(p.numel() for p in adapter.parameters())}
    for key in ("experts", "top_k", "dynamic_k"):
        if key in adapter.config:
            info[key] = adapter.config[key]
    emb = Embedder(name, image, text, fused, info)
    emb.adapter = adapter
    return emb


def conse_embedder(encoder: MultimodalEncoder) -> Embedder:
    """ConSE (Norouzi et al. 2014) with the image tower's ImageNet-1k head: a photo's vector is
    the mean of the text-tower embeddings of its top ImageNet class names weighted by their
    probabilities; a text is its text-tower embedding. No training on the catalogue."""
    try:
        from torchvision.models._meta import _IMAGENET_CATEGORIES as classes
    except ImportError as e:  # pragma: no cover - torchvision is a core dependency
        raise MissingExtra("the ConSE baseline needs torchvision's ImageNet class names") from e
    from vitrine.encoders.factory import _load_torch_weights, load_model_config, resolve_package_path

    cfg = encoder.towers.config or load_model_config(encoder.towers.name)[1]
    try:
        w = cfg["vitrine"]["weights"]["image"]
    except KeyError as e:
        raise ModelError(f"towers {encoder.towers.name} name no packaged image weights for ConSE") from e
    state = _load_torch_weights(resolve_package_path(f"package:{w['package']}/{w['file']}"))
    heads = [k for k in state if k.endswith("fc.weight") or k.endswith("classifier.weight")]
    if not heads:
        raise ModelError("the image tower's package has no ImageNet head for the ConSE baseline")
    fc_w = state[heads[-1]].float()
    fc_b = state[heads[-1].replace("weight", "bias")].float()
    pooled = int(fc_w.shape[1])
    names = torch.from_numpy(_norm(encoder.text_features([f"a photo of a {c}" for c in classes])))

    def image(x: np.ndarray) -> np.ndarray:
        p = torch.softmax(torch.from_numpy(x[:, :pooled]).float() @ fc_w.T + fc_b, dim=-1)
        top_p, top_i = p.topk(CONSE_TOP, dim=-1)
        v = (top_p[:, :, None] * names[top_i]).sum(1)
        return F.normalize(v, dim=-1).numpy()

    def text(x: np.ndarray) -> np.ndarray:
        return _norm(x.astype(np.float32))

    def fused(i: np.ndarray, t: np.ndarray) -> np.ndarray:
        return _norm(0.5 * image(i) + 0.5 * text(t))

    return Embedder("none (ConSE)", image, text, fused, {"kind": "conse", "top_classes": CONSE_TOP})


def text_tower_embedder() -> Embedder:
    """The text tower's own embeddings (rows without photos only)."""
    return Embedder("text tower alone", None, lambda x: _norm(x.astype(np.float32)), None, {"kind": "text-tower"})


def run_ablation(encoder: MultimodalEncoder, catalog: Catalog, embedders: Sequence[Embedder], *,
                 split: str = "test", n_attr: int = 500, seed: int = 1) -> dict[str, Any]:
    """Every embedder on the same queries and galleries (see the module docstring)."""
    t0 = time.time()
    img_f, txt_f = catalog.features(encoder)
    has_img = ~np.isnan(img_f).any(1)
    img_rows = np.flatnonzero(has_img)
    img_f0 = np.where(has_img[:, None], img_f, 0.0).astype(np.float32)
    groups = catalog.title_groups()
    qmask = catalog.split_mask(split)
    members: dict[int, dict[int, float]] = {}
    for row in img_rows:
        members.setdefault(int(groups[row]), {})[int(row)] = 1.0
    subcats = [r["subCategory"] for r in catalog.rows]
    sub_names = sorted(set(subcats))
    sub_feats = encoder.text_features(sub_names)
    by_cat: dict[str, dict[int, float]] = {}
    for i, c in enumerate(subcats):
        by_cat.setdefault(c, {})[i] = 1.0
    seeds = [i for i, m in enumerate(qmask) if m]
    attr_qs = aq.eval_queries(catalog.rows, seeds, n=n_attr, seed=seed)
    attr_feats = encoder.text_features([q["text"] for q in attr_qs])
    pos = {pid: i for i, pid in enumerate(catalog.ids)}
    attr_rel = [{pos[p]: 1.0 for p in q["relevant"] if p in pos} for q in attr_qs]

    rows: list[dict[str, Any]] = []
    for emb in embedders:
        t1 = time.time()
        m: dict[str, float] = {}
        if emb.image is not None and emb.fused is not None:
            gallery = emb.image(img_f0[img_rows])
            q = emb.text(txt_f[qmask])
            top = [[int(img_rows[j]) for j in t] for t in _topk(q, gallery, 10)]
            runs = [(t, members.get(int(g), {})) for t, g in zip(top, groups[qmask])]
            km = mean_metrics(runs, [1, 10], ("R", "MRR"))
            m |= {"kagl_R@1": km["R@1"], "kagl_R@10": km["R@10"], "kagl_MRR@10": km["MRR@10"]}
            prod = emb.fused(img_f0, txt_f)
            text_only = ~has_img
            if text_only.any():
                prod[text_only] = emb.text(txt_f[text_only])
            sm = mean_metrics([(t, by_cat[n]) for t, n in zip(_topk(emb.text(sub_feats), prod, 10), sub_names)],
                              [1, 10], ("P",))
            m |= {"subcat_P@1": sm["P@1"], "subcat_P@10": sm["P@10"]}
            am = mean_metrics(list(zip(_topk(emb.text(attr_feats), prod, 10), attr_rel)), [10], ("nDCG", "R"))
            m |= {"attr_nDCG@10": am["nDCG@10"], "attr_R@10": am["R@10"]}
        titles_only = emb.text(txt_f)
        tm = mean_metrics(list(zip(_topk(emb.text(attr_feats), titles_only, 10), attr_rel)), [10], ("nDCG",))
        m["textonly_attr_nDCG@10"] = tm["nDCG@10"]
        rows.append({"name": emb.name, **emb.info, "metrics": {k: round(float(v), 4) for k, v in m.items()},
                     "seconds": round(time.time() - t1, 1)})
        if isinstance(emb.adapter, CrossModalMoE):  # the gate reports its routing
            split_photos = img_rows[qmask[img_rows]]  # each with its own title: pairs
            rows[-1]["routing"] = emb.adapter.routing_stats(torch.from_numpy(img_f0[split_photos]),
                                                            torch.from_numpy(txt_f[split_photos]), pairs=True)
        log.info("ablation %s: %s", emb.name, rows[-1]["metrics"])
    return {"protocol": "ablation", "split": split, "kagl_queries": int(qmask.sum()), "photos": int(has_img.sum()),
            "products": len(catalog.rows), "subcategories": len(sub_names), "attr_queries": len(attr_qs),
            "model": encoder.towers.key, "rows": rows, "seconds": round(time.time() - t0, 1)}


def load_embedders(encoder: MultimodalEncoder, adapters: Sequence[str]) -> list[Embedder]:
    """The first adapter (the one served: the report's first row), the baselines, then the other
    adapters (each a folder or a shipped name; ``name=path`` to label it)."""
    loaded = []
    for spec in adapters:
        name, path, overrides = parse_adapter_spec(spec)
        loaded.append(adapter_embedder(name, load_adapter(path, overrides=overrides)))
    return loaded[:1] + [conse_embedder(encoder), text_tower_embedder()] + loaded[1:]


def write_report(result: dict[str, Any], out_dir: Path, stem: str = "gate_ablation") -> list[Path]:
    """``<stem>.md`` (the table), ``<stem>.json`` and ``<stem>.png`` (a bar chart) in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    js = out_dir / f"{stem}.json"
    js.write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        f"# Alignment ablation: adapters on the same {result['split']} split",
        "",
        f"Towers `{result['model']}`; {result['products']} products, {result['photos']} photos. KAGL: "
        f"{result['kagl_queries']} {result['split']}-split titles -> every photo. Sub-category: "
        f"{result['subcategories']} names -> fused product vectors. Attribute queries: {result['attr_queries']} "
        "(seeded by the split's products; relevant = every product with all the named attributes) -> fused "
        "product vectors; `textonly` = the same queries against title vectors only (a catalogue without "
        "photos). Exact search, no fusion. Raw numbers: `" + js.name + "`.",
        "",
        "| adapter | params | " + " | ".join(COLUMNS) + " |",
        "|---|---|" + "---|" * len(COLUMNS),
    ]
    for r in result["rows"]:
        cells = [f"{r['metrics'][c]:.4f}" if c in r["metrics"] else "" for c in COLUMNS]
        lines.append(f"| {r['name']} | {r.get('parameters', '')} | " + " | ".join(cells) + " |")
    routing = [r for r in result["rows"] if r.get("routing")]
    if routing:
        lines += ["", f"Routing on the {result['split']} split (photos and titles, each alone as when indexed or "
                  "queried):", "",
                  "| adapter | load CV | utilisation variance | entropy (max) | dead experts | experts/token "
                  "| photo & title share an expert | routing KL photo/title | photo-title cosine | load |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in routing:
            s = r["routing"]
            lines.append(f"| {r['name']} | {s['load_cv']} | {s.get('utilisation_variance', '')} | {s['entropy']} "
                         f"({s['max_entropy']}) | {s['dead_experts'] or 'none'} | {s['experts_per_token']} | "
                         f"{s.get('pairs_sharing_an_expert', '')} | {s.get('route_kl', '')} | "
                         f"{s.get('pair_cosine', '')} | {s['load']} |")
    md = out_dir / f"{stem}.md"
    png = out_dir / f"{stem}.png"
    lines += ["", f"![{png.name}]({png.name})", ""]
    md.write_text("\n".join(lines))
    plt = pyplot("the ablation plot")
    cols = [c for c in COLUMNS if any(c in r["metrics"] for r in result["rows"])]
    fig, ax = plt.subplots(figsize=(12, 4.5))
    width = 0.8 / max(1, len(result["rows"]))
    for i, r in enumerate(result["rows"]):
        ax.bar([j + i * width for j in range(len(cols))], [r["metrics"].get(c, 0.0) for c in cols], width,
               label=r["name"])
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cols))], cols, rotation=20, fontsize=8)
    ax.set_ylabel("score")
    ax.set_title(f"Alignment ablation ({result['split']} split)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return [md, js, png]
