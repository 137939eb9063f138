"""What merchandising rules cost a search (vitrine/merchandising/rules.py), with many rules stored.

The engine of a data dir serves its searches with a rule store of the benchmark's own (a SQLite
file in a temporary folder: the data dir's own rules are left alone), first empty, then holding
``n_rules`` rules shaped like a shop's: most for an exact query (a few of them the benchmark's own
queries, pinning, hiding and boosting), many for words a query contains (drawn from the
catalogue's titles, so they fire), a few for every search of a category within campaign dates.

Reported: the rules step alone (``RuleBook.apply``, timed inside real searches: matching the
query, resolving what the fired rules do, re-ordering the whole pool) and whole searches without
and with the rules, interleaved rounds (a shared machine's speed drifts), with the machine's
fp32 matmul GFLOP/s per core before and after.
"""

from __future__ import annotations

import random
import tempfile
import time
from pathlib import Path
from typing import Any

from vitrine.merchandising.store import RuleStore
from vitrine.search.engine import Engine
from vitrine.search.models import SearchRequest
from vitrine.merchandising.models import Rule
from vitrine.merchandising.rules import RuleBook
from vitrine.merchandising.stage import RulesStage
from vitrine_bench.common import Report, summary_ms
from vitrine_bench.encoders import matmul_flops


def catalogue_sample(engine: Engine, n: int, rng: random.Random) -> list[dict[str, Any]]:
    rows = [r.doc | {"id": r.id} for r in engine.records.iter_rows(with_vectors=False)]
    return rng.sample(rows, min(n, len(rows)))


def queries_of(products: list[dict[str, Any]], n: int, rng: random.Random) -> list[str]:
    out = []
    for p in products[:n]:
        words = p["title"].split()
        k = rng.randint(2, min(4, len(words))) if len(words) >= 2 else len(words)
        out.append(" ".join(words[:k]).lower())
    return out


def make_rules(products: list[dict[str, Any]], queries: list[str], n_rules: int,
               rng: random.Random) -> list[tuple[str, Rule]]:
    """``n_rules`` rules: 70% exact query (5% of the benchmark's queries among them), 29% contains,
    1% category campaigns with no query condition."""
    ids = [p["id"] for p in products]
    brands = sorted({p["brand"] for p in products if p.get("brand")} or {p["title"].split()[0] for p in products})
    cats = sorted({c for p in products for c in (p.get("category") or [])[:1]})
    vocab = sorted({w.lower() for p in products for w in p["title"].split() if w.isalpha() and len(w) > 3})
    now = time.time()
    rules: list[tuple[str, Rule]] = []
    for i in range(n_rules):
        share = i / n_rules
        cons: dict[str, Any] = {"pin": [{"id": rng.choice(ids), "position": rng.randint(0, 5)}],
                                "hide": [rng.choice(ids)],
                                "boost": [{"filter": {"brand": rng.choice(brands)}, "weight": 0.2}]}
        if share < 0.7:
            q = rng.choice(queries) if rng.random() < 0.05 else f"{rng.choice(vocab)} {rng.choice(vocab)} {i}"
            cond: dict[str, Any] = {"query": {"is": q}}
        elif share < 0.99:
            cond = {"query": {"contains": rng.choice(vocab)}}
            if rng.random() < 0.9:  # most contains rules are campaigns that are not on now
                cond |= {"from": now + 86400 * rng.randint(1, 30), "until": now + 86400 * 40}
        else:
            cond = {"category": rng.choice(cats), "from": now - 3600, "until": now + 86400}
            cons = {"banner": {"text": f"campaign {i}"}}
        rules.append((f"bench-{i:05d}", Rule.model_validate({"conditions": cond, "consequences": cons})))
    return rules


def run(engine: Engine, out: Path, *, n_rules: int = 10_000, n_queries: int = 300, rounds: int = 3,
        seed: int = 0) -> Path:
    rng = random.Random(seed)
    rep = Report("rules", out, f"Merchandising rules: cost per search with {n_rules:,} rules stored")
    products = catalogue_sample(engine, 2000, rng)
    queries = queries_of(products, n_queries, rng)
    gflops_before = matmul_flops(1, min_time=1.0) / 1e9
    stage = engine.stage(RulesStage)  # the read path's rules stage: its book is swapped per round
    served = stage.book
    with tempfile.TemporaryDirectory() as tmp:
        empty = RuleBook(RuleStore(Path(tmp) / "empty.sqlite"), engine.index, engine.settings.search)
        full = RuleBook(RuleStore(Path(tmp) / "rules.sqlite"), engine.index, engine.settings.search)
        t0 = time.perf_counter()
        full.put_many(make_rules(products, queries, n_rules, rng))
        put_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        fresh = RuleBook(RuleStore(Path(tmp) / "rules.sqlite"), engine.index, engine.settings.search)
        fresh.refresh()
        load_s = time.perf_counter() - t0
        step: dict[str, list[float]] = {"none": [], "rules": []}
        whole: dict[str, list[float]] = {"none": [], "rules": []}
        fired: list[int] = []

        def timed(book: RuleBook, key: str):
            apply = book.apply

            def wrapper(*a: Any, **kw: Any) -> Any:
                t = time.perf_counter()
                res = apply(*a, **kw)
                step[key].append(time.perf_counter() - t)
                if key == "rules":
                    fired.append(len(res.fired))
                return res
            return wrapper

        empty.apply, full.apply = timed(empty, "none"), timed(full, "rules")  # type: ignore[method-assign]  # timing wrappers for the bench
        try:
            for q in queries:  # warm: every query's encode cached alike for both, caches of both books built
                for book in (empty, full):
                    stage.book = book
                    engine.search(SearchRequest(text=q, k=10, facets=["brand"]))
            for times in step.values():
                times.clear()
            fired.clear()
            for _ in range(rounds):
                for key, book in (("none", empty), ("rules", full)):
                    stage.book = book
                    for q in queries:
                        t = time.perf_counter()
                        engine.search(SearchRequest(text=q, k=10, facets=["brand"]))
                        whole[key].append(time.perf_counter() - t)
        finally:
            stage.book = served
            for b in (empty, full, fresh):
                b.store.close()
    gflops_after = matmul_flops(1, min_time=1.0) / 1e9
    rows = [{"what": f"rules step, {'no rules' if k == 'none' else f'{n_rules:,} rules'}", **summary_ms(v)}
            for k, v in step.items()]
    rows += [{"what": f"whole search, {'no rules' if k == 'none' else f'{n_rules:,} rules'}", **summary_ms(v)}
             for k, v in whole.items()]
    rep.add("rows", rows)
    rep.add("params", {"n_rules": n_rules, "n_queries": n_queries, "rounds": rounds, "seed": seed,
                       "products": len(engine), "rules_refresh_s": engine.settings.search.rules_refresh_s})
    rep.add("put_many_s", put_s)
    rep.add("load_s", load_s)
    rep.add("fired_per_search_mean", sum(fired) / max(1, len(fired)))
    rep.add("searches_with_a_rule", sum(1 for f in fired if f) / max(1, len(fired)))
    rep.add("gflops_core", {"before": gflops_before, "after": gflops_after})
    rep.text(f"{len(engine):,} products; {n_queries} text queries (2-4 words of catalogue titles), k=10 with "
             f"brand facets, {rounds} interleaved rounds of each. {n_rules:,} rules: 70% exact query, 29% contains "
             f"(90% of them campaigns not yet on), 1% category campaigns; fired per search: "
             f"{rep.data['fired_per_search_mean']:.2f} on average, {100 * rep.data['searches_with_a_rule']:.0f}% "
             f"of searches fired at least one. Storing them (one transaction): {put_s:.2f} s; a process loading "
             f"them all: {load_s:.2f} s (once; later changes load alone). Machine: fp32 matmul "
             f"{gflops_before:.0f} GFLOP/s per core before, {gflops_after:.0f} after.")
    rep.table(rows, ["what", "p50_ms", "p95_ms", "p99_ms", "mean_ms", "n"])
    return rep.write()
