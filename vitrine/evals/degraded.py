"""Degraded photos: does a shopper's poor photo still find products of its kind?

Each photo of a split is searched as the engine searches a photo (its vector against every
product's photo vector, the whole catalogue as gallery, the photo's own product left out), clean
and degraded the ways photos from outside the catalogue are (vitrine/encoders/images.py:
augment_view): ``gray`` (grayscale), ``tiny`` (downscaled to 32 px and back), ``invert`` (a
negative: dark background), ``center`` (only the middle 60% of each side). Metric: P@10 of the
same category, at two levels (article type, e.g. "Tshirts"; sub-category, e.g. "Topwear").
The degraded views' features are cached like the training views'.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vitrine.encoders.adapters import load_adapter, parse_adapter_spec
from vitrine.encoders.encoder import MultimodalEncoder
from vitrine.evals.datasets import Catalog
from vitrine.evals.plotting import pyplot

log = logging.getLogger(__name__)

DEGRADATIONS: tuple[str, ...] = ("gray", "tiny", "invert", "center")
LEVELS = ("articleType", "subCategory")


def _photo_vectors(adapter: Any, feats: np.ndarray) -> np.ndarray:
    out = []
    with torch.inference_mode():
        for s in range(0, len(feats), 4096):
            out.append(adapter(torch.from_numpy(feats[s:s + 4096]), None).image.numpy())
    return np.concatenate(out) if out else np.zeros((0, adapter.dim), dtype=np.float32)


def same_category_precision(queries: np.ndarray, query_rows: np.ndarray, gallery: np.ndarray,
                            gallery_rows: np.ndarray, labels: np.ndarray, k: int = 10) -> float:
    """Mean share of the top ``k`` gallery items (the query's own row excluded) whose label is
    the query's."""
    g = torch.from_numpy(np.ascontiguousarray(gallery))
    hits = 0.0
    for s in range(0, len(queries), 512):
        sims = torch.from_numpy(np.ascontiguousarray(queries[s:s + 512])) @ g.T
        own = torch.from_numpy(gallery_rows[None, :] == query_rows[s:s + 512, None])
        sims[own] = -np.inf
        top = sims.topk(k, dim=1).indices.numpy()
        hits += float((labels[gallery_rows[top]] == labels[query_rows[s:s + 512], None]).mean(1).sum())
    return hits / max(1, len(queries))


def degraded_eval(encoder: MultimodalEncoder, catalog: Catalog, adapters: Sequence[str], *, split: str = "test",
                  degradations: Sequence[str] = DEGRADATIONS, k: int = 10, limit: int | None = None,
                  progress: bool = True) -> dict[str, Any]:
    """Same-category P@k of the split's photos (the first ``limit`` of them in catalogue order,
    or all), clean and per degradation, for each adapter (shipped names or folders;
    ``name=path`` labels one)."""
    img_f, _ = catalog.features(encoder, progress=progress)
    has_img = ~np.isnan(img_f).any(1)
    gallery_rows = np.flatnonzero(has_img)
    q_rows = np.flatnonzero(catalog.split_mask(split) & has_img)
    if limit:
        q_rows = q_rows[:limit]
    photos = [catalog.photo(catalog.ids[int(r)]) for r in q_rows]
    views = {"clean": img_f[q_rows]}
    for d in degradations:
        views[d] = encoder.image_features(photos, progress=progress, view=d)
    labels = {lvl: np.array([r[lvl] for r in catalog.rows]) for lvl in LEVELS}
    rows = []
    for spec in adapters:
        name, path, overrides = parse_adapter_spec(spec)
        adapter = load_adapter(path, overrides=overrides)
        gallery = _photo_vectors(adapter, img_f[gallery_rows])
        m: dict[str, dict[str, float]] = {}
        for view, feats in views.items():
            q = _photo_vectors(adapter, feats)
            m[view] = {lvl: round(same_category_precision(q, q_rows, gallery, gallery_rows, labels[lvl], k), 4)
                       for lvl in LEVELS}
        rows.append({"name": name, "kind": adapter.kind, "metrics": m})
        log.info("degraded %s: %s", name, m)
    return {"protocol": "degraded", "split": split, "queries": len(q_rows), "gallery": len(gallery_rows), "k": k,
            "degradations": list(degradations), "levels": list(LEVELS), "model": encoder.towers.key, "rows": rows}


def mean_degraded(result: dict[str, Any], row: int = 0, level: str = "articleType") -> float:
    """Mean same-category P@k over the degradations (not the clean photos) of one row."""
    m = result["rows"][row]["metrics"]
    return float(np.mean([m[d][level] for d in result["degradations"]]))


def write_report(result: dict[str, Any], out_dir: Path, stem: str = "degraded") -> list[Path]:
    """``<stem>.md``, ``<stem>.json``, ``<stem>.png`` in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    js, md, png = out_dir / f"{stem}.json", out_dir / f"{stem}.md", out_dir / f"{stem}.png"
    js.write_text(json.dumps(result, indent=2) + "\n")
    views = ["clean", *result["degradations"]]
    lines = [f"# Degraded photos: same-category P@{result['k']} ({result['split']} split)", "",
             f"{result['queries']} {result['split']}-split photos, each searched against every product photo "
             f"({result['gallery']}; its own product left out), clean and degraded: gray = grayscale, tiny = "
             "downscaled to 32 px and back, invert = negative, center = the middle 60% of each side. "
             f"Cell: P@{result['k']} of the same article type / same sub-category. Towers `{result['model']}`. "
             f"Raw numbers: `{js.name}`.", "",
             "| adapter | " + " | ".join(views) + " | mean degraded (article type) |",
             "|---|" + "---|" * (len(views) + 1)]
    for i, r in enumerate(result["rows"]):
        cells = [f"{r['metrics'][v]['articleType']:.3f} / {r['metrics'][v]['subCategory']:.3f}" for v in views]
        lines.append(f"| {r['name']} | " + " | ".join(cells) + f" | {mean_degraded(result, i):.3f} |")
    lines += ["", f"![{png.name}]({png.name})", ""]
    md.write_text("\n".join(lines))
    plt = pyplot("the degraded-photo plot")
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / max(1, len(result["rows"]))
    for i, r in enumerate(result["rows"]):
        ax.bar([j + i * width for j in range(len(views))], [r["metrics"][v]["articleType"] for v in views], width,
               label=r["name"])
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(views))], views)
    ax.set_ylabel(f"same article type P@{result['k']}")
    ax.set_title(f"Degraded photos ({result['split']} split)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return [md, js, png]
