"""What each learned part does when served, on a data dir whose log `vitrine simulate` filled.

The whole log's table is learned (as `vitrine tune --logs-only` learns it) and served by force
(pinned: not how Vitrine serves, which keeps only what wins on the later slice), one part at a
time, and each ranking of the judged queries is scored by nDCG@10 against their human judgements:
cold (no learning), the click table alone, with Rocchio feedback, with category affinity, with a
lower transfer threshold, with the learned ranker. The head / never-logged split is the one
`vitrine simulate --head H --unlogged U --seed 0` makes, so the figures are the same queries.

    python -m vitrine_bench.learning_parts --data COPY --queries data/wands-dev/queries.jsonl --head 20 --unlogged 0

bench-results/learning_curve.md (2026-12-07, "what carries past the page") holds its figures.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from vitrine.cli.base import make_settings
from vitrine.evals import simulate as sim
from vitrine.feedback import clicks, learning
from vitrine.feedback.stage import LearnedRerank
from vitrine.search.engine import Engine
from vitrine.search.models import SearchRequest

OFF = {"learn_rocchio_weight": 0.0, "learn_category_weight": 0.0, "learn_ranker": False}
PARTS: list[tuple[str, dict[str, Any]]] = [
    ("table only", OFF),
    ("table + Rocchio (default weight 1)", {**OFF, "learn_rocchio_weight": 1.0}),
    ("table + Rocchio weight 2", {**OFF, "learn_rocchio_weight": 2.0}),
    ("table + category affinity 0.5", {**OFF, "learn_category_weight": 0.5}),
    ("defaults, transfer threshold 0.3", {**OFF, "learn_rocchio_weight": 1.0, "learn_transfer_similarity": 0.3}),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--queries", type=Path, required=True)
    ap.add_argument("--head", type=int, default=20)
    ap.add_argument("--unlogged", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ranker", action="store_true", help="also train the learned ranker and serve it")
    a = ap.parse_args()
    rows = [json.loads(line) for line in a.queries.read_text().splitlines() if line.strip()]
    qs = sim.judged_queries(rows)
    random.Random(a.seed).shuffle(qs)  # as `vitrine simulate` splits them
    head, other = qs[:a.head], qs[a.head:a.head + a.unlogged]
    eng = Engine.open(make_settings(data_dir=a.data, learn_interval_s=0, log_searches=False))
    fs = eng.settings.feedback
    learned = eng.stage(LearnedRerank).learned
    fb = eng.feedback.log.read(since=0.0)
    now = time.time()
    kw: dict[str, Any] = {"min_users": fs.learn_min_users, "half_life_days": fs.learn_half_life_days,
                          "max_queries": fs.learn_max_queries, "em": fs.learn_propensity == "em",
                          "client_share": fs.learn_client_share, "bot_per_minute": fs.bot_events_per_minute}
    table = clicks.learn(fb, now=now, **kw)

    def ids(text: str, k: int = 10) -> list[str]:
        return [h.id for h in eng.search(SearchRequest(text=text, k=k)).results]

    def served(name: str, t: Any, over: dict[str, Any]) -> dict[str, Any]:
        old = {k: getattr(fs, k) for k in over}
        for k, v in over.items():
            setattr(fs, k, v)
        learned.pin(t)
        try:
            h = {q.qid: sim.ndcg10(ids(q.text), q) for q in head}
            o = {q.qid: sim.ndcg10(ids(q.text), q) for q in other}
        finally:
            learned.unpin()
            for k, v in old.items():
                setattr(fs, k, v)
        got = {"part": name, "logged": round(sim.mean(h), 4), "never_logged": round(sim.mean(o), 4)}
        print(json.dumps(got), flush=True)
        return got

    out = [served("cold (no learning)", None, {})]
    out += [served(name, table, over) for name, over in PARTS]
    if a.ranker:
        ranker = learning.train_ranker(lambda text: ids(text, learning.POOL), learned, fb, fs,
                                       clicks.texts_of(fb), kw, now)
        if ranker is not None:
            out.append(served("defaults + learned ranker", replace(table, ranker=ranker), {"learn_ranker": True}))
    print(json.dumps({"data": str(a.data), "head": len(head), "unlogged": len(other), "parts": out}, indent=1))
    eng.close()


if __name__ == "__main__":
    main()
