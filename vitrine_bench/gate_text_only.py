"""Writes bench-results/gate_text_only.md/.json: `vitrine train gate --data` on a text-only catalogue.

One master category of the bundled catalogue (all its products, no photos) is ingested as a new
shop's catalogue (vitrine/evals/domain_shift.py's helpers), tuned (`vitrine tune`), then the
aligner is trained on it text-only (`train gate --data`: vitrine/training/gate_data.py), installed
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
import sys
import time
from pathlib import Path
from typing import Any

from vitrine.evals import pseudo_queries as pq
from vitrine.evals.datasets import Catalog
from vitrine.evals.domain_shift import domain_queries, evaluate_catalogue, ingest_rows
from vitrine.training.gate_data import train_on_data
from vitrine.training.recipe import GateRecipe
from vitrine.evals.tuning import tune
from vitrine.index.vocabulary import GraphData
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
    ap.add_argument("--init", choices=["auto", "fresh", "live"], default="auto")
    ap.add_argument("--name", default="gate_text_only", help="Report file name (without extension)")
    ap.add_argument("--rewrite", type=Path, default=None, help="Only rewrite the report from this run's JSON")
    ap.add_argument("--lr", type=float, default=None, help="default: 2e-3 fresh, 5e-4 fine-tuning")
    args = ap.parse_args()
    if args.rewrite is not None:
        write(json.loads(args.rewrite.read_text()), args.out, args.name)
        return
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
                              "shipped_adapter": base.encoders.adapter, "machine": machine(),
                              "command": "python -m vitrine_bench.gate_text_only " + " ".join(sys.argv[1:])}
    try:
        if not len(engine):
            ingest_rows(engine, rows, None)
        result["shipped"] = measure(engine, queries, tune(engine))
        log.info("shipped aligner + tune: %s", {k: result["shipped"][k]["nDCG@10"] for k in SYSTEMS})
        result["train"] = train_on_data(engine, args.work / "adapter",
                                        GateRecipe(kind=args.kind, epochs=args.epochs, init=args.init, lr=args.lr))
        result["trained"] = measure(engine, queries, tune(engine)) if result["train"]["swap"]["switched"] else None
    finally:
        engine.close()
    result["seconds"] = round(time.time() - t0, 1)
    write(result, args.out, args.name)


def write(result: dict[str, Any], out: Path, name: str = "gate_text_only") -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    tr = result["train"]
    lines = [f"# `vitrine train gate --data` on a text-only catalogue ({result['domain']})", "",
             f"Command: `{result.get('command')}` (with `PYTHONPATH=. VITRINE_TORCH_THREADS=1 nice -n 19`). "
             f"Machine: {result['machine']}; {result.get('load', '')} Total {result['seconds']} s.", "",
             f"The shipped aligner (`{result['shipped_adapter']}`) was trained on the bundled catalogue's train "
             "split, this domain's included (with photos): the catalogue is new to it as a text-only shop, not as "
             "a domain.", "",
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
                who = f"vitrine ({label})" if system == "vitrine" else system
                lines.append(f"| {kind} | {who} | {m['nDCG@10']:.4f} | {m['R@10']:.4f} | {m['MRR@10']:.4f} |")
    lines += ["", "Tuning (held-out pseudo-query objective of `vitrine tune`):", ""]
    for label, st in stages:
        lines.append(f"- {label}: {'accepted' if st['tuning']['accepted'] else 'floor kept'} "
                     f"`{st['tuning']['weights']}`; held-out {st['tuning']['heldout']}")
    lines += ["", f"![nDCG@10 per query set]({name}.png)"]
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(result["queries"])
    bars = [("text_tower", result["shipped"], "text_tower"), ("bm25", result["shipped"], "bm25"),
            ("shipped + tune", result["shipped"], "vitrine")]
    if result.get("trained"):
        bars.append((f"trained ({tr['init']}) + re-tune", result["trained"], "vitrine"))
    fig, ax = plt.subplots(figsize=(8, 4))
    w = 0.8 / len(bars)
    for i, (label, st, system) in enumerate(bars):
        ax.bar([j + i * w for j in range(len(kinds))], [st["by_kind"][k][system]["nDCG@10"] for k in kinds], w,
               label=label)
    ax.set_xticks([j + 0.4 - w / 2 for j in range(len(kinds))], kinds)
    ax.set_ylabel("nDCG@10")
    ax.set_title(f"text-only {result['domain']} catalogue")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / f"{name}.png", dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
