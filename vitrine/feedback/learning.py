"""Learning a per-query re-ranking from the search log, kept only if it beats what serves on a
later slice of the log. `vitrine tune` runs it (vitrine/evals/log_tuning.py), and so does the API
every ``learn_interval_s`` when new events arrived (vitrine/web/lifecycle.py).

1. The log (searches and their events, within retention) is split in time, query by query: the
   earlier ``1 - heldout`` of each query's searches to learn from, the later ones to judge on.
2. A per-query re-ranking is learned from the earlier part (vitrine/feedback/clicks.py: a
   position-based click model, per-user caps, decay).
3. Judged on the later part (only its searches made after the serving table was learned, which
   that table never saw): each of its queries with evidence is searched as it serves now and with
   the candidate re-ranking, and each ranking's order of the products the later part showed is
   scored by nDCG@10 against that part's own debiased success rates (successes per examination);
   products it never showed are skipped, neither credit nor blame.
4. Kept (re-learned on the whole log, written to ``learned.json``, which every worker re-reads
   within a second) only with evidence that it beats what serves: at least ``learn_min_judged``
   judged queries, a higher mean nDCG@10, and a paired test over the queries (Wilcoxon
   signed-rank, one-sided: learned > serving) below ``learn_alpha``; else what serves stays. A
   mean over a handful of queries moves with one lucky query; the test asks whether the queries
   that improved outweigh those that got worse, by rank, beyond what chance gives.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from vitrine.feedback.types import EventLogAPI, FeedbackSlice, SearchLog
from vitrine.feedback import clicks
from vitrine.feedback.intake import LearnedQueries, LearnedTable, save_learned
from vitrine.metrics import ndcg_at_k
from vitrine.settings import FeedbackSettings

log = logging.getLogger(__name__)

K = 10
SearchIds = Callable[[str], list[str]]  # query text -> the ids the engine ranks first (its first POOL)
POOL = 50


@dataclass
class LearnResult:
    table: LearnedTable | None  # the table now serving from this run (None: not changed by it)
    full: LearnedTable | None  # the whole log's table, kept or not (for labelled queries)
    texts: dict[str, str] = field(default_factory=dict)
    report: dict[str, Any] = field(default_factory=dict)


def split_in_time(fb: FeedbackSlice, heldout: float) -> tuple[FeedbackSlice, FeedbackSlice]:
    """The earlier and later parts of a slice: each query's searches in time order, cut at the one
    that starts its last ``heldout`` share (per query, so a query that only just became popular
    is judged on its own later searches too); each event goes with its search."""
    by_query: dict[str, list[SearchLog]] = {}
    for s in sorted(fb.searches, key=lambda s: s.ts):
        by_query.setdefault(s.norm, []).append(s)
    early_s: list[SearchLog] = []
    late_s: list[SearchLog] = []
    for group in by_query.values():
        cut = int(round(len(group) * (1 - heldout)))
        early_s += group[:cut]
        late_s += group[cut:]
    early_ids = {s.query_id for s in early_s}
    early = FeedbackSlice(sorted(early_s, key=lambda s: s.ts), [e for e in fb.events if e.query_id in early_ids])
    late = FeedbackSlice(sorted(late_s, key=lambda s: s.ts), [e for e in fb.events if e.query_id not in early_ids])
    return early, late


def judge(search_ids: SearchIds, learned: LearnedQueries, table: LearnedTable | None,
          gains: dict[str, dict[str, float]], texts: dict[str, str]) -> dict[str, float]:
    """nDCG@10 per judged query of the engine's ranking with ``table`` serving, over the products
    the judging slice showed (its ranking of them, those it ranks past its first :data:`POOL` last;
    the others skipped): a ranking is judged on how it orders what has evidence, neither credited
    nor blamed for what no one was shown."""
    learned.pin(table)
    try:
        out = {}
        for q, g in gains.items():
            ranked = [p for p in search_ids(texts.get(q, q)) if p in g]
            seen = set(ranked)
            out[q] = ndcg_at_k(ranked + [p for p in g if p not in seen], g, K, gain="linear")  # past the pool: last
        return out
    finally:
        learned.unpin()


def paired_test(before: dict[str, float], after: dict[str, float]) -> float:
    """One-sided p-value of the Wilcoxon signed-rank test that ``after`` beats ``before`` over
    the same queries (1.0 when no query changed)."""
    diffs = [after[q] - before[q] for q in before if abs(after[q] - before[q]) > 1e-9]
    if not diffs:
        return 1.0
    return float(stats.wilcoxon(diffs, alternative="greater").pvalue)


def learn_from_log(log_: EventLogAPI, learned: LearnedQueries, search_ids: SearchIds, settings: FeedbackSettings,
                   data_dir: Path, *, heldout: float = 0.3, now: float | None = None, save: bool = True) -> LearnResult:
    """Learn from the log (see the module docstring)."""
    t0 = time.time()
    now = time.time() if now is None else now
    fb = log_.read(since=now - settings.events_retention_days * 86400.0)
    texts = clicks.texts_of(fb)
    report: dict[str, Any] = {"searches": len(fb.searches), "events": len(fb.events)}
    if not fb.events:
        report["outcome"] = "no events in the log: nothing learned"
        return LearnResult(None, None, texts, report)
    kw: dict[str, Any] = {"min_users": settings.learn_min_users, "half_life_days": settings.learn_half_life_days,
          "max_queries": settings.learn_max_queries, "em": settings.learn_propensity == "em",
          "client_share": settings.learn_client_share, "bot_per_minute": settings.bot_events_per_minute}
    early, late = split_in_time(fb, heldout)
    serving = learned.table()
    if serving is not None:  # judge only on what the serving table did not learn from
        fresh = {s.query_id for s in late.searches if s.ts > serving.created}
        late = FeedbackSlice([s for s in late.searches if s.query_id in fresh],
                             [e for e in late.events if e.query_id in fresh])
    candidate = clicks.learn(early, now=now, **kw)
    late_ev = clicks.gather(late, now=now, half_life_days=settings.learn_half_life_days, em=kw["em"],
                            client_share=kw["client_share"], bot_per_minute=kw["bot_per_minute"])
    gains = {q: g for q, g in clicks.labels(late_ev).items()
             if q in candidate.queries and any(v > 0 for v in g.values())}  # some product above the mean
    report.update({"learn": {"searches": len(early.searches), "events": len(early.events), **candidate.report},
                   "judge": {"searches": len(late.searches), "events": len(late.events), "queries": len(gains)}})
    accepted = False
    if gains:
        before = judge(search_ids, learned, serving, gains, texts)
        after = judge(search_ids, learned, candidate, gains, texts)
        b, a = float(np.mean(list(before.values()))), float(np.mean(list(after.values())))
        p = paired_test(before, after)
        enough = len(gains) >= settings.learn_min_judged
        accepted = enough and a > b and (p < settings.learn_alpha or settings.learn_alpha >= 1.0)
        report["judge"].update({"nDCG@10_serving": round(b, 4), "nDCG@10_learned": round(a, 4),
                                "improved": sum(after[q] > before[q] + 1e-9 for q in gains),
                                "worse": sum(after[q] < before[q] - 1e-9 for q in gains),
                                "p_value": round(p, 6), "alpha": settings.learn_alpha,
                                "min_judged": settings.learn_min_judged})
        if not enough:
            report["judge"]["note"] = (f"{len(gains)} judged queries, fewer than learn_min_judged "
                                       f"({settings.learn_min_judged}): not enough evidence to replace what serves")
    else:
        report["judge"]["note"] = "no head query of the earlier part has evidence in the later part"
    full = clicks.learn(fb, now=now, **kw)
    table: LearnedTable | None = None
    if accepted:
        table = full
        table.report = {**table.report, "judge": report["judge"], "accepted": True}
        if save:
            report["path"] = str(save_learned(data_dir, table))
            learned.reload()
        report["outcome"] = (f"learned re-ranking of {len(table.queries)} head queries kept: later-slice nDCG@10 "
                             f"{report['judge']['nDCG@10_serving']:.4f} -> {report['judge']['nDCG@10_learned']:.4f}")
    else:
        report["outcome"] = ("learned re-ranking not kept: no evidence that it beats what serves on the later slice "
                             "(learn_min_judged judged queries and a Wilcoxon p-value below learn_alpha)")
    report["seconds"] = round(time.time() - t0, 2)
    log.info("learning from the search log: %s", report["outcome"])
    return LearnResult(table, full, texts, report)
