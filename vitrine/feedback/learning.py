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
   judged queries, a higher mean nDCG@10, and a paired test over the queries (a randomisation
   test of the mean difference, one-sided: learned > serving; :func:`paired_test`) below ``learn_alpha``, and a mean no lower than the
   text tower's own ranking (the floor, no learning) on the same slice; else what serves stays. A
   mean over a handful of queries moves with one lucky query; the test asks whether the queries
   that improved outweigh those that got worse, by rank, beyond what chance gives.
5. With ``learn_ranker``, a learned ranker (vitrine/feedback/ltr.py) is trained on the earlier part
   beside the table and judged with it the same way; it serves only when the table with it beats
   the table alone as well (then it is re-trained on the whole log with the whole log's table).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from vitrine.feedback.types import EventLogAPI, FeedbackSlice, SearchLog
from vitrine.feedback import clicks, ltr, ltr_fit
from vitrine.feedback.intake import LearnedQueries, LearnedTable, save_learned
from vitrine.metrics import ndcg_at_k
from vitrine.search import calibration, variants
from vitrine.settings import FeedbackSettings

log = logging.getLogger(__name__)

K = 10
SearchIds = Callable[[str], list[str]]  # query text -> the ids the engine ranks first (its first POOL)
POOL = 50
RESAMPLES = 1 << 13  # sign flips drawn by the paired test when there are more than this many (2^13: its p-value within 0.005 of the exact one near 0.05)


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


def judge_floor(search_ids: SearchIds, learned: LearnedQueries, gains: dict[str, dict[str, float]],
                texts: dict[str, str]) -> dict[str, float]:
    """:func:`judge` of the text tower's own ranking (the catalogue's floor, no learning)."""
    with variants.ranking(variants.RankingOverride("learning", "floor", calibration=calibration.floor(),
                                                   learn_weight=0.0)):
        return judge(search_ids, learned, None, gains, texts)


def pool_rows(search_ids: SearchIds, learned: LearnedQueries, table: LearnedTable, queries: list[str],
              texts: dict[str, str]) -> dict[str, list[ltr.Row]]:
    """Per query: its pool's ranker rows as the learned stage builds them with ``table`` serving."""
    learned.pin(table)
    learned.capture(True)
    try:
        for q in queries:
            search_ids(texts.get(q, q))
    finally:
        got = learned.capture(False)
        learned.unpin()
    return {q: rows for q, rows in got}


def train_ranker(search_ids: SearchIds, learned: LearnedQueries, fb: FeedbackSlice, settings: FeedbackSettings,
                 texts: dict[str, str], kw: dict[str, Any], now: float) -> ltr.Ranker | None:
    """A learned ranker from a slice of the log (vitrine/feedback/ltr_fit.py): its earlier half's
    table serves while the rows are built and gives their popularity features, its later half's
    IPS evidence labels them; served with the whole slice's popularity. None when the later half
    has too few queries with a chosen product."""
    past, later = split_in_time(fb, 0.5)
    labels = ltr_fit.ips(later, em=kw["em"], bot_per_minute=kw["bot_per_minute"])
    queries = sorted(q for q, rel in labels.rel.items() if any(v > 0 for v in rel.values()))
    if len(queries) < 2:
        return None
    table = clicks.learn(past, now=now, **kw)
    return ltr_fit.train(pool_rows(search_ids, learned, table, queries, texts), labels,
                         past=ltr_fit.ips(past, em=kw["em"], bot_per_minute=kw["bot_per_minute"]),
                         whole=ltr_fit.ips(fb, em=kw["em"], bot_per_minute=kw["bot_per_minute"]), created=now)


def paired_test(before: dict[str, float], after: dict[str, float]) -> float:
    """One-sided p-value of the paired randomisation (sign-flip) test that ``after`` beats
    ``before`` over the same queries: the share of the 2^n ways of flipping the per-query
    differences' signs whose mean reaches the observed mean (exact up to 2^13 of them, else
    :data:`RESAMPLES` random flips, seeded); 1.0 when no query changed.

    Why this test and not the Wilcoxon signed-rank test: both ask whether the queries that
    improved outweigh those that got worse beyond what chance gives, and both need only that a
    difference is as likely to be positive as negative when nothing changed; the randomisation
    test weighs each query by how much it moved, the signed-rank test only by the rank of that
    move. Compared over IR runs, the randomisation test (and the t-test) agreed with each other
    and the signed-rank and sign tests did not (Smucker, Allan & Carterette, CIKM 2007), who
    recommend it for comparing rankings over queries (docs/learning.md)."""
    diffs = np.array([after[q] - before[q] for q in before], dtype=np.float64)
    diffs = diffs[np.abs(diffs) > 1e-9]
    if not diffs.size:
        return 1.0
    if diffs.size == 1:  # its two sign flips: reached by itself alone when it is a gain, by both when a loss
        return 0.5 if diffs[0] > 0 else 1.0
    got = stats.permutation_test((diffs,), np.mean, permutation_type="samples", alternative="greater",
                                 n_resamples=RESAMPLES, batch=max(1, 10_000_000 // diffs.size), random_state=0)
    return float(got.pvalue)


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
    ranker = train_ranker(search_ids, learned, early, settings, texts, kw, now) if settings.learn_ranker else None
    late_ev = clicks.gather(late, now=now, half_life_days=settings.learn_half_life_days, em=kw["em"],
                            client_share=kw["client_share"], bot_per_minute=kw["bot_per_minute"])
    gains = {q: g for q, g in clicks.labels(late_ev).items()
             if q in candidate.queries and any(v > 0 for v in g.values())}  # some product above the mean
    report.update({"learn": {"searches": len(early.searches), "events": len(early.events), **candidate.report},
                   "judge": {"searches": len(late.searches), "events": len(late.events), "queries": len(gains)}})
    accepted = with_ranker = False
    if gains:
        before = judge(search_ids, learned, serving, gains, texts)
        after = judge(search_ids, learned, candidate, gains, texts)
        f = float(np.mean(list(judge_floor(search_ids, learned, gains, texts).values())))
        b, a = float(np.mean(list(before.values()))), float(np.mean(list(after.values())))
        p = paired_test(before, after)
        enough = len(gains) >= settings.learn_min_judged

        def wins(mean: float, pv: float) -> bool:
            return enough and mean > b and mean >= f and (pv < settings.learn_alpha or settings.learn_alpha >= 1.0)

        accepted = wins(a, p)
        report["judge"].update({"nDCG@10_serving": round(b, 4), "nDCG@10_learned": round(a, 4),
                                "nDCG@10_floor": round(f, 4),
                                "improved": sum(after[q] > before[q] + 1e-9 for q in gains),
                                "worse": sum(after[q] < before[q] - 1e-9 for q in gains),
                                "p_value": round(p, 6), "alpha": settings.learn_alpha,
                                "min_judged": settings.learn_min_judged})
        if ranker is not None:
            ranked = judge(search_ids, learned, replace(candidate, ranker=ranker), gains, texts)
            r, pr = float(np.mean(list(ranked.values()))), paired_test(before, ranked)
            with_ranker = wins(r, pr) and r > a
            accepted = accepted or with_ranker
            report["judge"]["ranker"] = {"nDCG@10_learned_ranker": round(r, 4), "p_value": round(pr, 6),
                                         "kept": with_ranker, "train": ranker.report}
        if not enough:
            report["judge"]["note"] = (f"{len(gains)} judged queries, fewer than learn_min_judged "
                                       f"({settings.learn_min_judged}): not enough evidence to replace what serves")
    else:
        report["judge"]["note"] = "no head query of the earlier part has evidence in the later part"
    full = clicks.learn(fb, now=now, **kw)
    if ranker is not None:  # the whole log's ranker (served only when its earlier part's won)
        full.ranker = train_ranker(search_ids, learned, fb, settings, texts, kw, now)
    table: LearnedTable | None = None
    if accepted:
        table = full if with_ranker else replace(full, ranker=None)
        table.report = {**table.report, "judge": report["judge"], "accepted": True}
        if save:
            report["path"] = str(save_learned(data_dir, table))
            learned.reload()
        got = report["judge"]["ranker"]["nDCG@10_learned_ranker"] if with_ranker else report["judge"]["nDCG@10_learned"]
        report["outcome"] = (f"learned re-ranking of {len(table.queries)} head queries kept"
                             f"{' with its learned ranker' if table.ranker is not None else ''}: later-slice nDCG@10 "
                             f"{report['judge']['nDCG@10_serving']:.4f} -> {got:.4f}")
    else:
        report["outcome"] = ("learned re-ranking not kept: no evidence that it beats what serves on the later slice "
                             "(learn_min_judged judged queries, a paired test's p-value below learn_alpha, not below "
                             "the text tower's floor)")
    report["seconds"] = round(time.time() - t0, 2)
    log.info("learning from the search log: %s", report["outcome"])
    return LearnResult(table, full, texts, report)
