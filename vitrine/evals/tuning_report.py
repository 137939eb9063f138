"""The report `vitrine tune` writes: what was chosen and what each choice gained (markdown, JSON, plot)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def rounded(weights: dict[str, float]) -> dict[str, float]:
    """Weights to four decimals, as reports print them."""
    return {k: round(v, 4) for k, v in weights.items()}


def write_report(result: Any, out_dir: Path, name: str = "tuning") -> list[Path]:
    """``name``.md, .json and .png in ``out_dir``: what was chosen and what each choice gained."""
    out_dir.mkdir(parents=True, exist_ok=True)
    r = result.report
    paths = [out_dir / f"{name}.json", out_dir / f"{name}.md", out_dir / f"{name}.png"]
    paths[0].write_text(json.dumps(r, indent=2, sort_keys=True))
    lines = [f"# Catalogue tuning ({r['products']} products)", "",
             f"Pseudo-queries: {r['queries']['total']} ({r['queries']['fit']} fit, {r['queries']['heldout']} held out); "
             f"by kind: {r['queries']['by_kind']}.", "",
             f"Fitted weights: `{rounded(r['fitted'])}`. **{'Accepted' if r['accepted'] else 'Not accepted: the floor stays'}** "
             f"(must beat native-only on held-out by {r['margin']}). Served: `{rounded(r['chosen'])}`.", "",
             *([f"Kind guard (a loss on a kind costs {r['kind_guard']['penalty']}x a gain): "
                + (f"shrunk toward the floor by {r['kind_guard']['shrink']} -> `{rounded(r.get('guarded', {}))}`"
                   if r['kind_guard'].get('shrink') is not None else
                   f"every shrink still lost on held-out kinds {r['kind_guard'].get('losing')}: the floor stays")
                + ".", ""] if "kind_guard" in r and not r["kind_guard"].get("off") else []),
             *([f"The mean of {len(r['samples'])} fits, one per sample of pseudo-queries (each scaled to sum 1): "
                + "; ".join(f"`{m}`" for m in r["samples"]) + ".", ""] if len(r.get("samples", [])) > 1 else []),
             "## Held-out pseudo-queries", "",
             "| ranking | objective | nDCG@10 | R@10 | MRR@10 | nDCG@10 by kind |", "|---|---|---|---|---|---|"]
    for label, m in r["heldout"].items():
        lines.append(f"| {label} | {m['objective']:.4f} | {m['nDCG@10']:.4f} | {m['R@10']:.4f} | {m['MRR@10']:.4f} | "
                     + ", ".join(f"{k} {v:.3f}" for k, v in m["by_kind"].items()) + " |")
    lines += ["", "## What each fitted signal gained (held-out objective, fitted minus fitted without it)", "",
              "| signal | gain |", "|---|---|"]
    lines += [f"| {k} | {v:+.4f} |" for k, v in r["heldout_gain_per_signal"].items()]
    if r.get("labelled"):
        lab = r["labelled"]
        lines += ["", f"## The shop's own labelled queries ({lab['share']:.0%} of the objective)", "",
                  "Queries: " + ", ".join(f"{k} {v['fit']} fit / {v['heldout']} held out" for k, v in lab["queries"].items())
                  + ". Held-out part (the fit must not lose to the floor here):", "",
                  "| ranking | objective | nDCG@10 | R@10 | MRR@10 |", "|---|---|---|---|---|"]
        lines += [f"| {label} | {m['objective']:.4f} | {m['nDCG@10']:.4f} | {m['R@10']:.4f} | {m['MRR@10']:.4f} |"
                  for label, m in lab["heldout"].items()]
    rf = r.get("relevance_floor") or {}
    if rf.get("fitted") is not None:
        lines += ["", f"Relevance floor: **{rf['fitted']}** of a query's top score (best F{rf.get('beta', 1):g} of the mean precision and recall on {rf['queries']} "
                  f"held-out pseudo-queries: precision {rf['precision']}, recall {rf['recall']}; the configured "
                  f"{rf['configured']}).", "", "| floor | precision | recall |", "|---|---|---|",
                  *[f"| {c['floor']} | {c['precision']} | {c['recall']} |" for c in rf["curve"]]]
    lines += ["", f"Slot filters: {r['slot_filters']}", "", f"Signals seen in the pools: {r['signals_seen']}",
              "", f"Took {r['seconds']['total']} s ({r['seconds']['pools']} s building pools)."]
    paths[1].write_text("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        labels = list(r["heldout"])
        kinds = sorted({k for m in r["heldout"].values() for k in m["by_kind"]})
        fig, ax = plt.subplots(figsize=(8, 4))
        width = 0.8 / max(1, len(labels))
        for i, label in enumerate(labels):
            ax.bar([j + i * width for j in range(len(kinds))], [r["heldout"][label]["by_kind"].get(k, 0) for k in kinds],
                   width, label=label)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(kinds))], kinds)
        ax.set_ylabel("held-out nDCG@10")
        ax.set_title("Catalogue tuning: held-out pseudo-queries")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(paths[2], dpi=100)
        plt.close(fig)
    except ImportError:  # pragma: no cover - matplotlib is a dependency of the bench extra
        paths.pop()
    return paths
