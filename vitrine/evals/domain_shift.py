"""`vitrine eval --protocol domain-shift`: leave one domain out, then serve it as a new catalogue.

For each held-out master category D of the bundled catalogue (Apparel, Footwear, Accessories,
Personal Care by default):

1. everything Vitrine trains is fitted without D's products: the aligner is trained on the other
   domains' train split (``train_aligner``, injected by the CLI: the encoders' training code);
2. D's test-split products are ingested as a new shop's catalogue, twice: with their photos and
   text-only; each data dir is tuned on its own pseudo-queries (`vitrine tune`: self-calibration
   uses the catalogue's records, never queries or judgements);
3. D's test-split attribute queries ("men black casual shoes") and exact-word queries (a brand
   and rare title words) search it: ``vitrine`` (Engine.search, intent on), ``text_tower``
   (brute-force cosine of the text tower over the product texts: the floor) and ``bm25``
   (SQLite FTS5 over the same records).

Output: ``{"domains": {D: {"vitrine": {nDCG@10, R@10, MRR@10}, "text_tower": ..., "bm25": ...,
"text_only": {same three, on the text-only catalogue}, ...}}}``. The bar: in every domain,
``vitrine`` >= ``text_tower`` on nDCG@10.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vitrine.encoders.queries import unit_rows
from vitrine.evals.attribute_queries import eval_queries
from vitrine.metrics import mean_metrics
from vitrine.evals.tuning import tune
from vitrine.evals.word_queries import word_queries
from vitrine.search.engine import Engine, build_encoder
from vitrine.search.models import product_text
from vitrine.search.writes import ProductInput
from vitrine.search.models import Product, SearchRequest
from vitrine.settings import Settings

log = logging.getLogger(__name__)

DOMAINS = ("Apparel", "Footwear", "Accessories", "Personal Care")
NAMES = ("nDCG", "R", "MRR")


def _metrics(runs: Sequence[tuple[list[str], dict[str, float]]]) -> dict[str, float]:
    m = mean_metrics(runs, [10], NAMES)
    return {k: round(v, 4) for k, v in m.items()}


def domain_queries(rows: list[dict[str, str]], n_attr: int, n_words: int, brand_fn: Callable[[str], str | None],
                   seed: int = 1, seed_rows: Sequence[int] | None = None) -> list[dict]:
    """Attribute + exact-word queries seeded by ``seed_rows`` (default: every row) of ``rows`` and
    judged over all ``rows``."""
    idx = list(seed_rows) if seed_rows is not None else list(range(len(rows)))
    qs = [{**q, "kind": "attr"} for q in eval_queries(rows, idx, n=n_attr, seed=seed, brand_fn=brand_fn)]
    qs += [{**q, "kind": "words"} for q in word_queries(rows, idx, n=n_words, seed=seed + 1, brand_fn=brand_fn)]
    return qs


def catalogue_record(row: dict[str, str]) -> dict[str, Any]:
    """A bundled-catalogue row as a product record (as `vitrine convert-fashion` writes it)."""
    attrs = {"gender": row["gender"], "colour": row["baseColour"], "season": row["season"], "year": row["year"],
             "usage": row["usage"], "articleType": row["articleType"]}
    return {"id": row["id"], "title": row["productDisplayName"],
            "category": [row["masterCategory"], row["subCategory"], row["articleType"]],
            "attributes": {k: v for k, v in attrs.items() if v and v != "NA"}}


def ingest_rows(engine: Engine, rows: list[dict[str, str]], photo: Callable[[str], bytes] | None) -> None:
    """Bundled-catalogue rows into ``engine``, with their photos (``photo(id)``) or text-only (None)."""
    items = []
    for r in rows:
        rec = catalogue_record(r)
        items.append(ProductInput(Product.model_validate(rec), image=photo(r["id"]) if photo else None))
    for s in range(0, len(items), 512):
        engine.upsert(items[s:s + 512])


def _text_tower(engine: Engine, queries: list[dict]) -> list[tuple[list[str], dict[str, float]]]:
    rows = list(engine.records.iter_rows(with_vectors=False))
    prod = unit_rows(engine.encoder.text_features([product_text(Product.model_validate(r.doc)) for r in rows]))
    q = unit_rows(engine.encoder.text_features([x["text"] for x in queries]))
    top = np.argsort(-(q @ prod.T), axis=1, kind="stable")[:, :10]
    return [([rows[j].id for j in t], x["relevant"]) for t, x in zip(top, queries)]


def _bm25(engine: Engine, queries: list[dict]) -> list[tuple[list[str], dict[str, float]]]:
    ids = {r.iid: r.id for r in engine.records.iter_rows(with_vectors=False)}
    return [([ids[i] for i, _ in engine.records.bm25(x["text"], 10)], x["relevant"]) for x in queries]


def _vitrine(engine: Engine, queries: list[dict]) -> list[tuple[list[str], dict[str, float]]]:
    return [([h.id for h in engine.search(SearchRequest(text=x["text"], k=10)).results], x["relevant"])
            for x in queries]


def evaluate_catalogue(engine: Engine, queries: list[dict]) -> dict[str, Any]:
    """The three systems on one data dir, overall and per query kind."""
    runs = {"vitrine": _vitrine(engine, queries), "text_tower": _text_tower(engine, queries),
            "bm25": _bm25(engine, queries)}
    out: dict[str, Any] = {name: _metrics(r) for name, r in runs.items()}
    kinds = [q["kind"] for q in queries]
    out["by_kind"] = {k: {name: _metrics([x for x, kk in zip(r, kinds) if kk == k]) for name, r in runs.items()}
                      for k in sorted(set(kinds))}
    return out


def domain_shift(base: Settings, rows: list[dict[str, str]], splits: dict[str, str], photo: Callable[[str], bytes],
                 train_aligner: Callable[[list[dict[str, str]], Path], Path], work_dir: Path, *,
                 domains: Sequence[str] = DOMAINS, n_attr: int = 200, n_words: int = 100,
                 brand_fn: Callable[[str], str | None], retrain: bool = True) -> dict[str, Any]:
    """Run the protocol (see the module doc). ``train_aligner(rows, out_dir)`` trains an adapter on
    ``rows`` (their train split) and returns its folder; ``retrain=False`` keeps the configured one
    (then the aligner has seen every domain: say so)."""
    result: dict[str, Any] = {"domains": {}, "protocol": "domain-shift", "aligner_retrained": retrain}
    for d in domains:
        t0 = time.time()
        held = [r for r in rows if r["masterCategory"] == d and splits.get(r["id"]) == "test"]
        others = [r for r in rows if r["masterCategory"] != d]
        if not held:
            log.warning("domain %s has no test products: skipped", d)
            continue
        adapter = str(train_aligner(others, work_dir / d / "adapter")) if retrain else base.encoders.adapter
        queries = domain_queries(held, n_attr, n_words, brand_fn)
        entry: dict[str, Any] = {"products": len(held), "queries": len(queries), "adapter": adapter}
        encoder = build_encoder(base.updated(**{"adapter": adapter}))
        entry["aligner"] = aligner_summary(encoder.adapter.config)
        for label, with_photos in (("photos", True), ("text_only", False)):
            settings = base.updated(**{"adapter": adapter, "data_dir": work_dir / d / label})
            engine = Engine(settings, encoder)
            try:
                ingest_rows(engine, held, photo if with_photos else None)
                res = tune(engine)
                got = evaluate_catalogue(engine, queries)
                got["tuning"] = {"accepted": res.calibration.accepted, "weights": res.calibration.text_weights,
                                 "slot_filters": res.calibration.slot_filters,
                                 "heldout": {k: v["objective"] for k, v in res.report["heldout"].items()}}
            finally:
                engine.close()
            if with_photos:
                entry.update(got)
            else:
                entry["text_only"] = got
        entry["meets_bar"] = all(e["vitrine"]["nDCG@10"] >= e["text_tower"]["nDCG@10"]
                                 for e in (entry, entry["text_only"]))
        entry["seconds"] = round(time.time() - t0, 1)
        log.info("domain-shift %s: %s", d, {k: entry[k]["nDCG@10"] for k in ("vitrine", "text_tower", "bm25")})
        result["domains"][d] = entry
    result["meets_bar"] = all(e["meets_bar"] for e in result["domains"].values())
    return result


def aligner_summary(config: dict[str, Any]) -> dict[str, Any]:
    """What an adapter's config.json says about the aligner a domain was served with: its kind and
    architecture, and the best epoch and validation score of its training."""
    train = config.get("train", {})
    out = {k: config[k] for k in ("kind", "experts", "top_k", "hidden", "dim") if k in config}
    return out | {"best_epoch": train.get("best_epoch"), "epochs": train.get("config", {}).get("epochs"),
                  "val_MRR@10": round(float(train["val_score"]), 4) if "val_score" in train else None}


def write_report(result: dict[str, Any], out_dir: Path, name: str = "domain-shift") -> list[Path]:
    """``name``.md, .json and .png: nDCG@10 / R@10 / MRR@10 per held-out domain and system."""
    import json

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.json", out_dir / f"{name}.md", out_dir / f"{name}.png"]
    paths[0].write_text(json.dumps(result, indent=2) + "\n")
    lines = ["# Leave-domain-out: each master category served as a new catalogue", "",
             f"Aligner retrained without the domain: {result.get('aligner_retrained')}. "
             f"Bar (vitrine >= text_tower on nDCG@10 in every domain, both catalogues): "
             f"**{'met' if result.get('meets_bar') else 'NOT met'}**.", "",
             "| domain | catalogue | products | queries | system | nDCG@10 | R@10 | MRR@10 |",
             "|---|---|---|---|---|---|---|---|"]
    for d, e in result["domains"].items():
        for label, block in (("photos", e), ("text-only", e["text_only"])):
            for system in ("vitrine", "text_tower", "bm25"):
                m = block[system]
                lines.append(f"| {d} | {label} | {e['products']} | {e['queries']} | {system} | {m['nDCG@10']:.4f} | "
                             f"{m['R@10']:.4f} | {m['MRR@10']:.4f} |")
    lines += ["", "Aligner per held-out domain (trained on the other domains' train split, early-stopped on "
                  "their val split):", ""]
    for d, e in result["domains"].items():
        a = e.get("aligner", {})
        arch = f"{a.get('kind')}" + (f", {a['experts']} experts, top-{a['top_k']}" if "experts" in a else "") + \
            (f", hidden {a['hidden']}" if "hidden" in a else "")
        lines.append(f"- {d}: {arch}; best epoch {a.get('best_epoch')} of {a.get('epochs')}, "
                     f"val title->photo MRR@10 {a.get('val_MRR@10')}; {e.get('seconds')} s for the domain")
    lines += ["", "Tuning chosen per catalogue (held-out pseudo-query objective):", ""]
    for d, e in result["domains"].items():
        for label, block in (("photos", e), ("text-only", e["text_only"])):
            t = block["tuning"]
            lines.append(f"- {d} / {label}: {'accepted' if t['accepted'] else 'floor kept'} `{t['weights']}`, "
                         f"slot filters {'on' if t['slot_filters'] else 'off'}; held-out {t['heldout']}")
    paths[1].write_text("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        doms = list(result["domains"])
        fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
        for ax, (label, get) in zip(axes, (("photos", lambda e: e), ("text-only", lambda e: e["text_only"]))):
            for i, system in enumerate(("vitrine", "text_tower", "bm25")):
                ax.bar([j + i * 0.27 for j in range(len(doms))],
                       [get(result["domains"][d])[system]["nDCG@10"] for d in doms], 0.27, label=system)
            ax.set_xticks([j + 0.27 for j in range(len(doms))], doms, fontsize=8)
            ax.set_title(f"held-out domain, {label} catalogue")
        axes[0].set_ylabel("nDCG@10")
        axes[0].legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(paths[2], dpi=100)
        plt.close(fig)
    except ImportError:  # pragma: no cover
        paths.pop()
    return paths
