"""Writes bench-results/gate_text_only.md/.json: `vitrine train gate --data` on a text-only catalogue.

One master category of the bundled catalogue (all its products, no photos) is ingested as a new
shop's catalogue (vitrine/evals/domain_shift.py's helpers), tuned (`vitrine tune`), then the
aligner is trained on it text-only (`train gate --data`: vitrine/evals/gate_training.py), installed
by the canary-checked hot swap and the catalogue re-tuned. Measured before and after, with the
text tower's own cosine ranking (the floor) and BM25 beside it:

- the domain's test-split attribute and exact-word queries, judged over the whole catalogue;
- held-out pseudo-queries: a title variant (words dropped) of each product the aligner held out
  (the gate's hash split), relevant = every product with that title.

Usage: python -m vitrine_bench.gate_text_only [--domain Footwear] [--work DIR] [--out bench-results]
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import time
from pathlib import Path
from typing import Any

from vitrine.evals import pseudo_queries as pq
from vitrine.evals.datasets import Catalog
from vitrine.evals.domain_shift import domain_queries, evaluate_catalogue, ingest_rows
from vitrine.evals.gate_training import train_on_data
from vitrine.evals.tuning import tune
from vitrine.index.graph import GraphData
from vitrine.search.engine import Engine, build_encoder
from vitrine.settings import Settings
from vitrine_bench.common import machine

log = logging.getLogger(__name__)
SYSTEMS = ("vitrine", "text_tower", "bm25")


def heldout_title_queries(rows: list[dict[str, str]], seed: int = 0, heldout: float = 0.15) -> list[dict]:
    """A title variant of every product the gate held out (its split), relevant = same title."""
    by_title: dict[str, list[str]] = {}
    for r in rows:
        by_title.setdefault(r["productDisplayName"].casefold(), []).append(r["id"])
    rng = random.Random(seed + 1)  # not the variants the gate validated on
    out = []
    for r in rows:
        if pq.split_of(r["id"], heldout, f"vitrine-gate-{seed}") != "heldout":
            continue
        text = pq.title_variant(r["productDisplayName"], rng)
        if text:
            out.append({"qid": f"pseudo-{r['id']}", "text": text, "kind": "heldout_pseudo_title",
                        "relevant": {i: 1.0 for i in by_title[r["productDisplayName"].casefold()]}})
    return out


def measure(engine: Engine, queries: list[dict], res: Any) -> dict[str, Any]:
    got = evaluate_catalogue(engine, queries)
    got["model_key"] = engine.model_key
    got["tuning"] = {"accepted": res.calibration.accepted, "weights": res.calibration.text_weights,
                     "heldout": {k: v["objective"] for k, v in res.report["heldout"].items()}}
    return got


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--domain", default="Footwear")
    ap.add_argument("--work", type=Path, default=Path("/tmp/vitrine-gate-text-only"))
    ap.add_argument("--out", type=Path, default=Path("bench-results"))
    ap.add_argument("--kind", default="moe")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--n-attr", type=int, default=200)
    ap.add_argument("--init", choices=["fresh", "live"], default="fresh")
    ap.add_argument("--lr", type=float, default=2e-3)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    t0 = time.time()
    full = Catalog.load()
    rows = [r for r in full.rows if r["masterCategory"] == args.domain]
    test_idx = [i for i, r in enumerate(rows) if full.splits.get(r["id"]) == "test"]
    base = Settings().updated(data_dir=args.work / "data")
    brands = GraphData.load(base.index.graph_dir, base.index.taxonomy_file).brands
    queries = domain_queries(rows, args.n_attr, max(1, args.n_attr // 2), brands.from_title, seed_rows=test_idx)
    queries += heldout_title_queries(rows)
    engine = Engine(base, build_encoder(base))
    result: dict[str, Any] = {"domain": args.domain, "products": len(rows), "test_seed_products": len(test_idx),
                              "queries": {k: sum(q["kind"] == k for q in queries) for k in sorted({q["kind"] for q in queries})},
                              "shipped_adapter": base.encoders.adapter, "machine": machine()}
    try:
        if not len(engine):
            ingest_rows(engine, rows, None)
        result["shipped"] = measure(engine, queries, tune(engine))
        log.info("shipped aligner + tune: %s", {k: result["shipped"][k]["nDCG@10"] for k in SYSTEMS})
        result["train"] = train_on_data(engine, args.work / "adapter", kind=args.kind, epochs=args.epochs,
                                        init=args.init, lr=args.lr)
        result["trained"] = measure(engine, queries, tune(engine)) if result["train"]["swap"]["switched"] else None
    finally:
        engine.close()
    result["seconds"] = round(time.time() - t0, 1)
    write(result, args.out)


def write(result: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "gate_text_only.json").write_text(json.dumps(result, indent=2) + "\n")
    tr = result["train"]
    lines = [f"# `vitrine train gate --data` on a text-only catalogue ({result['domain']})", "",
             f"Machine: {result['machine']}. Total {result['seconds']} s.", "",
             f"Catalogue: every {result['domain']} product of the bundled catalogue ({result['products']}), "
             f"ingested without photos. Queries: {result['queries']}.", "",
             f"Training: {tr['kind']} ({tr['init']} weights), {tr['train_products']} products trained on, {tr['heldout_products']} held out, "
             f"{tr['pseudo_queries']} pseudo-queries; best epoch {tr['best_epoch']} of {tr['epochs_run']}, held-out "
             f"title-variant MRR@10 {tr['heldout_MRR@10']:.4f} (the served aligner before: "
             f"{tr['heldout_MRR@10_served_before']:.4f}); swap: {tr['swap']}; re-tune: {tr.get('tune')}.", "",
             "| query set | system | nDCG@10 | R@10 | MRR@10 |", "|---|---|---|---|---|"]
    stages = [("shipped aligner + tune", result["shipped"])]
    if result.get("trained"):
        stages.append(("text-only trained aligner + re-tune", result["trained"]))
    for kind in result["queries"]:
        for label, st in stages:
            for system in SYSTEMS:
                if system != "vitrine" and label != stages[0][0]:
                    continue  # the floor and BM25 do not depend on the aligner
                m = st["by_kind"][kind][system]
                name = f"vitrine ({label})" if system == "vitrine" else system
                lines.append(f"| {kind} | {name} | {m['nDCG@10']:.4f} | {m['R@10']:.4f} | {m['MRR@10']:.4f} |")
    lines += ["", "Tuning (held-out pseudo-query objective of `vitrine tune`):", ""]
    for label, st in stages:
        lines.append(f"- {label}: {'accepted' if st['tuning']['accepted'] else 'floor kept'} "
                     f"`{st['tuning']['weights']}`; held-out {st['tuning']['heldout']}")
    (out / "gate_text_only.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
