"""Two measurements behind the storefront search (vitrine/search/storefront.py):

- ``typo``: the test split's exact-word queries (``vitrine make-queries --kind words``) with one or
  two edits (a letter inserted, deleted, replaced, or two neighbours swapped) in words of 4+
  letters; nDCG@10 of the clean and the corrupted queries with BM25's typo tolerance off and on.
- ``floor``: how far below a query's top score its relevant products fall, on val queries; the
  relevance floor (a fraction of the top score) is the largest that keeps 95% of the relevant
  products a page of ``max_k`` holds, and the report says how much of the rest it cuts.
"""

from __future__ import annotations

import random
import string
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from vitrine.evals.datasets import EvalQuery
from vitrine.evals.protocols import run_qrels
from vitrine.index import fuzzy
from vitrine.index.bm25 import MemoryBM25
from vitrine.search.engine import Engine
from vitrine.search.models import SearchRequest
from vitrine_bench.common import Report

KEEP_RELEVANT = 0.95


def corrupt_word(word: str, rng: random.Random) -> str:
    """One random edit of ``word``: insert, delete, replace a letter, or swap two neighbours."""
    i = rng.randrange(len(word))
    op = rng.choice(("insert", "delete", "replace", "swap"))
    letters = string.ascii_lowercase
    if op == "insert":
        return word[:i] + rng.choice(letters) + word[i:]
    if op == "delete":
        return word[:i] + word[i + 1:]
    if op == "replace":
        return word[:i] + rng.choice([c for c in letters if c != word[i].lower()]) + word[i + 1:]
    j = min(i, len(word) - 2)
    return word[:j] + word[j + 1] + word[j] + word[j + 2:] if word[j] != word[j + 1] else word[:j] + "x" + word[j + 1:]


def corrupt(text: str, rng: random.Random) -> tuple[str, int]:
    """``text`` with one or two edits in its words of 4+ letters (at most as many per word as typo
    tolerance forgives a word that long). Returns (text, edits made)."""
    words = text.split()
    budget = {i: fuzzy.max_edits(w) for i, w in enumerate(words) if w.isalpha()}
    budget = {i: b for i, b in budget.items() if b > 0}
    edits = 0
    for _ in range(rng.choice((1, 2))):
        if not budget:
            break
        i = rng.choice(sorted(budget))
        words[i] = corrupt_word(words[i], rng)
        edits += 1
        budget[i] -= 1
        if budget[i] == 0:
            del budget[i]
    return " ".join(words), edits


def typo(engine: Engine, queries: list[EvalQuery], out: Path, seed: int = 0, gain: str = "exponential",
         name: str = "typo") -> Path:
    rng = random.Random(seed)
    bad = []
    for q in queries:
        text, n = corrupt(q.text or "", rng)
        if n:
            bad.append(replace(q, text=text, meta={**q.meta, "clean": q.text, "edits": n}))
    clean = [q for q in queries if any(b.qid == q.qid for b in bad)]
    rows: list[dict[str, Any]] = []
    # off; BM25 alone forgives typos; BM25 and the query's reading (every signal searches the corrected words)
    for arm, tolerant, spelling in (("off", False, False), ("bm25", True, False), ("bm25+query", True, True)):
        MemoryBM25.typo_tolerance = tolerant
        engine.settings.index.typo_tolerance = tolerant
        engine.settings.search.query_spelling = spelling
        for kind, qs in (("clean", clean), ("with typos", bad)):
            r = run_qrels(engine, qs, [1, 10], progress=False, gain=gain)
            m = r["metrics"]
            rows.append({"queries": kind, "typo_tolerance": arm, "n": len(qs),
                         "nDCG@10": m["nDCG@10"], "R@10": m["R@10"], "MRR@10": m.get("MRR@10", m.get("MRR")),
                         "p50_ms": r["latency_ms"]["p50"]})
            print(rows[-1], flush=True)
    MemoryBM25.typo_tolerance = engine.settings.index.typo_tolerance = True
    engine.settings.search.query_spelling = True
    rep = Report(name, out, "Typo tolerance: queries with one or two edits")
    rep.add("results", rows)
    rep.add("examples", [{"clean": b.meta["clean"], "typo": b.text} for b in bad[:15]])
    rep.text(f"Each query of the file given one or two random edits (insert, delete, replace a letter or "
             f"swap two neighbours; seed {seed}) in words of 4+ letters, at most one per word under 8 letters. "
             f"{len(bad)} queries over {len(engine)} products; the full engine (vectors, BM25, graph, intent) ranks "
             f"them; nDCG's gain: {gain}. Typo tolerance: off; bm25: a query word no product holds scores in BM25 "
             "as its closest catalogue term (vitrine/index/fuzzy.py); bm25+query: and every signal searches the "
             "query with such words read as the catalogue's (vitrine/search/spelling.py). p50_ms: the engine's "
             "time per query on this machine as it was. Examples: " +
             "; ".join(f"\"{b.meta['clean']}\" -> \"{b.text}\"" for b in bad[:5]) + ".")
    rep.table(rows, ["queries", "typo_tolerance", "n", "nDCG@10", "R@10", "MRR@10", "p50_ms"], "Results")

    def draw(ax) -> None:
        labels = [f"{r['queries']}\n{r['typo_tolerance']}" for r in rows]
        ax.bar(range(len(rows)), [r["nDCG@10"] for r in rows], color=["#999", "#c44", "#999", "#c84", "#999", "#4a4"])
        ax.set_xticks(range(len(rows)), labels, fontsize=8)
        ax.set_ylabel("nDCG@10")
        ax.set_title("Queries, clean and with typos")
        ax.grid(alpha=0.3, axis="y")

    rep.plot(f"{name}.png", draw)
    return rep.write()


def floor(engine: Engine, queries: list[EvalQuery], out: Path) -> Path:
    """The relevance floor from val queries: per query, each result's score over the top score."""
    k = engine.settings.search.max_k
    rel_ratios: list[float] = []
    other_ratios: list[float] = []
    for q in queries:
        res = engine.search(SearchRequest(text=q.text, k=k))
        if not res.results or res.results[0].score <= 0:
            continue
        top = res.results[0].score
        for h in res.results:
            (rel_ratios if h.id in q.relevant else other_ratios).append(h.score / top)
    rel, other = np.array(rel_ratios), np.array(other_ratios)
    grid = np.round(np.arange(0.0, 1.0001, 0.01), 2)
    kept = np.array([(rel >= f).mean() for f in grid])
    cut = np.array([(other < f).mean() for f in grid])
    best = float(grid[np.flatnonzero(kept >= KEEP_RELEVANT).max()])
    rows = [{"floor": float(f), "relevant_kept": float(kept[i]), "others_cut": float(cut[i])}
            for i, f in enumerate(grid) if round(f * 100) % 5 == 0 or f == best]
    rep = Report("relevance_floor", out, "Relevance floor for sorted and faceted searches")
    rep.add("chosen", best)
    rep.add("results", rows)
    rep.text(f"{len(queries)} val queries (`vitrine make-queries --split val`), each ranked to k={k} over "
             f"{len(engine)} products. For each result, its score over the query's top score. The floor is the "
             f"largest fraction that keeps {KEEP_RELEVANT:.0%} of the relevant results: **{best:.2f}** "
             f"(Settings.relevance_floor / VITRINE_RELEVANCE_FLOOR); it cuts "
             f"{float(cut[grid == best][0]):.0%} of the other results. Fusion: {engine.settings.search.fusion}.")
    rep.table(rows, ["floor", "relevant_kept", "others_cut"], "Share of results kept / cut per floor")

    def draw(ax) -> None:
        ax.plot(grid, kept, label="relevant kept")
        ax.plot(grid, cut, label="others cut")
        ax.axvline(best, color="k", ls="--", lw=0.8, label=f"chosen {best:.2f}")
        ax.set_xlabel("floor (fraction of the top score)")
        ax.legend()
        ax.grid(alpha=0.3)

    rep.plot("relevance_floor.png", draw)
    return rep.write()
