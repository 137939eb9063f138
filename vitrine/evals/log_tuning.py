"""`vitrine tune` on the search log: what shoppers chose, kept only if it beats what serves on a
later slice of the log.

1. The log (searches and their events, within retention) is split in time: the earlier
   ``1 - heldout`` of its searches to learn from, the later ones to judge on.
2. A per-query re-ranking is learned from the earlier part (vitrine/evals/clicks.py: a
   position-based click model, per-user caps, decay).
3. Judged on the later part: each of its queries with evidence is searched through the engine as
   it serves now and with the candidate re-ranking; the gains are the later part's own
   debiased success rates (successes per examination). A product the later part never showed has
   gain 0, which favours what serves now: the candidate must win despite that.
4. Kept (re-learned on the whole log, written to ``learned.json``, which every worker re-reads)
   only if it beats what serves on mean nDCG@10; else what serves stays.
5. The whole log's head queries, with the products shoppers clearly chose, become labelled
   queries (kind ``shop:logs``) for the catalogue's fusion tune (vitrine/evals/tuning.py), which
   holds out part of them by query and keeps a fitted mix only if it does not lose to the floor
   there, so logged queries inform how never-logged queries rank too.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vitrine.evals import clicks
from vitrine.evals import pseudo_queries as pq
from vitrine.index.eventlog import FeedbackSlice
from vitrine.search.engine import Engine
from vitrine.search.feedback import LearnedTable, save_learned
from vitrine.search.models import SearchRequest

log = logging.getLogger(__name__)

K = 10
CHOSEN = 0.5  # a product whose score is at least this is "clearly chosen" (a labelled relevant one)


@dataclass
class LogTuneResult:
    table: LearnedTable | None
    labelled: list[pq.PseudoQuery] = field(default_factory=list)
    report: dict[str, Any] = field(default_factory=dict)


def split_in_time(fb: FeedbackSlice, heldout: float) -> tuple[FeedbackSlice, FeedbackSlice]:
    """The earlier and later parts of a slice, cut at the search that starts the last ``heldout``
    share; each event goes with its search."""
    searches = sorted(fb.searches, key=lambda s: s.ts)
    cut = int(round(len(searches) * (1 - heldout)))
    early_ids = {s.query_id for s in searches[:cut]}
    early = FeedbackSlice([s for s in searches[:cut]], [e for e in fb.events if e.query_id in early_ids])
    late = FeedbackSlice([s for s in searches[cut:]], [e for e in fb.events if e.query_id not in early_ids])
    return early, late


def judge(engine: Engine, table: LearnedTable | None, gains: dict[str, dict[str, float]],
          texts: dict[str, str]) -> dict[str, float]:
    """nDCG@10 per judged query of the engine's ranking with ``table`` serving."""
    learned = engine.reads.learned
    learned.pin(table)
    try:
        out = {}
        for q, g in gains.items():
            res = engine.search(SearchRequest(text=texts.get(q, q), k=K))
            out[q] = clicks.ndcg([h.id for h in res.results], g, K)
        return out
    finally:
        learned.unpin()


def tune_from_logs(engine: Engine, *, heldout: float = 0.3, now: float | None = None, save: bool = True,
                   seed: int = 0) -> LogTuneResult:
    """Learn from the engine's search log (see the module docstring)."""
    t0 = time.time()
    now = time.time() if now is None else now
    fs = engine.settings.feedback
    fb = engine.feedback.log.read(since=now - engine.feedback.retention_s)
    texts = clicks.texts_of(fb)
    report: dict[str, Any] = {"searches": len(fb.searches), "events": len(fb.events)}
    if not fb.events:
        report["outcome"] = "no events in the log: nothing learned"
        return LogTuneResult(None, [], report)
    kw = {"min_users": fs.learn_min_users, "half_life_days": fs.learn_half_life_days,
          "max_queries": fs.learn_max_queries}
    early, late = split_in_time(fb, heldout)
    candidate = clicks.learn(early, now=now, **kw)
    late_ev = clicks.gather(late, now=now, half_life_days=fs.learn_half_life_days)
    gains = {q: g for q, g in clicks.labels(late_ev).items() if q in candidate.queries and any(v > 0 for v in g.values())}
    serving = engine.reads.learned.table()
    report.update({"learn": {"searches": len(early.searches), "events": len(early.events),
                             "head_queries": len(candidate.queries), **candidate.report},
                   "judge": {"searches": len(late.searches), "events": len(late.events), "queries": len(gains)}})
    accepted = False
    if gains:
        before = judge(engine, serving, gains, texts)
        after = judge(engine, candidate, gains, texts)
        b, a = float(np.mean(list(before.values()))), float(np.mean(list(after.values())))
        accepted = a > b
        report["judge"].update({"nDCG@10_serving": round(b, 4), "nDCG@10_learned": round(a, 4),
                                "improved": sum(after[q] > before[q] + 1e-9 for q in gains),
                                "worse": sum(after[q] < before[q] - 1e-9 for q in gains)})
    else:
        report["judge"]["note"] = "no head query of the earlier part has evidence in the later part"
    table: LearnedTable | None = None
    if accepted:
        table = clicks.learn(fb, now=now, **kw)
        table.report = {**table.report, "judge": report["judge"], "accepted": True}
        if save:
            report["path"] = str(save_learned(engine.data_dir, table))
            engine.reads.learned.unpin()
        report["outcome"] = (f"learned re-ranking of {len(table.queries)} head queries kept: later-slice nDCG@10 "
                             f"{report['judge']['nDCG@10_serving']:.4f} -> {report['judge']['nDCG@10_learned']:.4f}")
    else:
        report["outcome"] = "learned re-ranking not kept: it did not beat what serves on the later slice"
    # the whole log's clear choices, as labelled queries for the fusion tune
    full = table or clicks.learn(fb, now=now, **kw)
    rows = [(f"log:{q}", texts.get(q, q), {d: 1.0 for d, z in boosts.items() if z >= CHOSEN})
            for q, boosts in full.queries.items()]
    labelled = pq.labelled(rows, kind="shop:logs", seed=seed)
    report["labelled_queries"] = len(labelled)
    report["seconds"] = round(time.time() - t0, 2)
    log.info("tune from logs: %s", report["outcome"])
    return LogTuneResult(table, labelled, report)
