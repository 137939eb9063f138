"""Training the learned ranker (vitrine/feedback/ltr.py) from the click log.

Labels: inverse-propensity scored clicks. The examination propensity of rank ``r`` is the
position-based model's ``theta[r]`` (vitrine/feedback/clicks.py: the prior ``1 / (r + 1)``, or
fitted by EM with ``learn_propensity=em``), clipped at ``1 / MAX_IPS``. A query's IPS estimate of
a product is the sum, over the units (users, else sessions, else clients) that chose it, of the
event's weight (click 1, add-to-cart 1.5, purchase 2) over the propensity of the best rank that
unit saw it at, divided by the units that were shown it: an estimate of the product's
attractiveness that does not depend on where it was shown (Joachims et al., *Unbiased
Learning-to-Rank with Biased Feedback*, 2017). A query's group holds the products its log showed
(a product nobody was shown has no evidence, neither good nor bad); its labels are the estimates
graded 0..:data:`GRADES` against the query's best.

The model: LightGBM's lambdarank (gradient-boosted trees optimising nDCG), small trees and a
fixed seed, one thread (deterministic: the same log gives the same model).
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vitrine.feedback import clicks
from vitrine.feedback.ltr import LOG_FEATURES, Ranker, Row, matrix
from vitrine.feedback.types import FeedbackSlice

log = logging.getLogger(__name__)

GRADES = 4
MAX_IPS = 20.0  # clipped inverse propensity: one click at a deep rank counts at most this much
PRIOR_IMPRESSIONS = 2.0  # popularity's shrinkage toward the catalogue-wide rate
PARAMS: dict[str, Any] = {
    "objective": "lambdarank", "metric": "ndcg", "eval_at": [10], "lambdarank_truncation_level": 20,
    "learning_rate": 0.05, "num_leaves": 7, "min_data_in_leaf": 5, "feature_fraction": 1.0,
    "bagging_fraction": 1.0, "lambda_l2": 1.0, "deterministic": True, "force_row_wise": True,
    "num_threads": 1, "seed": 0, "verbose": -1,
}
ROUNDS = 100


@dataclass
class Clicks:
    """IPS evidence of a slice of the log: per query, product -> IPS estimate (``rel``), the units
    shown each product (``shown``) and the units behind each query; and the raw IPS sums and
    impressions per product over all queries (for popularity)."""

    rel: dict[str, dict[str, float]] = field(default_factory=dict)
    shown: dict[str, dict[str, int]] = field(default_factory=dict)
    ips_sum: dict[str, float] = field(default_factory=dict)
    impressions: dict[str, int] = field(default_factory=dict)
    propensity: str = "prior 1/(rank+1)"


def propensity(theta: np.ndarray, rank: int) -> float:
    """The clipped examination propensity of a 0-based rank."""
    return max(float(theta[min(rank, len(theta) - 1)]), 1.0 / MAX_IPS)


def ips(fb: FeedbackSlice, *, theta: np.ndarray | None = None, em: bool = False, bot_per_minute: int = 60) -> Clicks:
    """The IPS evidence of ``fb`` (the module docstring): pages sorted other than by relevance, image
    searches and bots' events left out, as the click model does."""
    bots = clicks.bot_clients(fb, bot_per_minute)
    by_id = {s.query_id: s for s in fb.searches if s.norm and not s.image and clicks.context_weight(s) > 0
             and s.client not in bots}
    events = [e for e in fb.events if e.client not in bots and e.query_id in by_id]
    event_user = {e.query_id: e.user for e in events if e.user}
    unit = {qid: clicks.user_of(s, event_user.get(qid)) for qid, s in by_id.items()}
    best: dict[tuple[str, str, str], int] = {}  # (query, product, unit) -> best rank seen
    for qid, s in by_id.items():
        for i, pid in enumerate(s.ids):
            key = (s.norm, pid, unit[qid])
            best[key] = min(best.get(key, s.offset + i), s.offset + i)
    won: dict[tuple[str, str, str], float] = {}
    for e in events:
        s = by_id[e.query_id]
        key = (s.norm, e.product_id, unit[e.query_id])
        won[key] = max(won.get(key, 0.0), clicks.EVENT_WEIGHT.get(e.type, 0.0) * clicks.context_weight(s))
        best.setdefault(key, e.position)
    out = Clicks()
    if theta is None and em:
        cells: dict[tuple[str, str, int], list[float]] = defaultdict(lambda: [0.0, 0.0])
        for (q, d, u), r in best.items():
            cells[(q, d, r)][0] += 1.0
            cells[(q, d, r)][1] += 1.0 if (q, d, u) in won else 0.0
        theta = clicks.fit_theta(cells)
        if theta is not None:
            out.propensity = "PBM by EM"
    th = clicks.prior_theta() if theta is None else theta
    sums: dict[tuple[str, str], float] = defaultdict(float)
    shown: dict[tuple[str, str], int] = defaultdict(int)
    for (q, d, u), r in best.items():
        shown[(q, d)] += 1
        if (q, d, u) in won:
            sums[(q, d)] += won[(q, d, u)] / propensity(th, r)
    for (q, d), n in shown.items():
        out.rel.setdefault(q, {})[d] = sums.get((q, d), 0.0) / n
        out.shown.setdefault(q, {})[d] = n
        out.ips_sum[d] = out.ips_sum.get(d, 0.0) + sums.get((q, d), 0.0)
        out.impressions[d] = out.impressions.get(d, 0) + n
    return out


def popularity(ev: Clicks, leaves: Mapping[str, str]) -> tuple[dict[str, float], dict[str, float]]:
    """Per product and per leaf category: its IPS click rate over every logged query, shrunk toward
    the catalogue-wide rate by :data:`PRIOR_IMPRESSIONS` impressions, relative to that rate (0: as
    popular as the average shown product; ``leaves``: product -> leaf category)."""
    tot_i = sum(ev.impressions.values())
    if tot_i <= 0:
        return {}, {}
    p0 = max(sum(ev.ips_sum.values()) / tot_i, 1e-6)

    def rate(s: float, n: float) -> float:
        return round(((s + PRIOR_IMPRESSIONS * p0) / (n + PRIOR_IMPRESSIONS) - p0) / p0, 6)

    per = {d: rate(ev.ips_sum.get(d, 0.0), n) for d, n in ev.impressions.items()}
    cs: dict[str, float] = defaultdict(float)
    cn: dict[str, float] = defaultdict(float)
    for d, n in ev.impressions.items():
        c = leaves.get(d, "")
        if c:
            cs[c] += ev.ips_sum.get(d, 0.0)
            cn[c] += n
    return {d: v for d, v in per.items() if v}, {c: rate(cs[c], cn[c]) for c in cn}


def grades(rel: Mapping[str, float]) -> dict[str, int]:
    """A query's IPS estimates graded 0..GRADES against its best (any chosen product at least 1)."""
    top = max(rel.values(), default=0.0)
    if top <= 0:
        return {d: 0 for d in rel}
    return {d: (max(1, min(GRADES, int(math.ceil(GRADES * v / top - 1e-9)))) if v > 0 else 0) for d, v in rel.items()}


def train(groups: Mapping[str, Sequence[Row]], labels: Clicks, *, past: Clicks, whole: Clicks,
          created: float = 0.0, rounds: int = ROUNDS) -> Ranker | None:
    """A ranker from each logged query's pool rows (``groups``: query -> rows, as the stage built
    them with the table of ``past`` serving), labelled by the IPS evidence of a later slice
    (``labels``); the popularity features of training come from ``past`` too, those it serves
    with from ``whole`` (the slice it is served after). Features from the past, labels from what
    followed, as at serving: a feature computed from the very clicks that label a row (a
    product's popularity, its learned boost) predicts the label perfectly in training and nothing
    after. None when fewer than two queries have a chosen product among the rows they showed."""
    import lightgbm

    leaves = {r.pid: r.leaf for rows in groups.values() for r in rows}
    pop, cats = popularity(past, leaves)
    signals = sorted({k[len("signal:"):] for rows in groups.values() for r in rows for k in r.values
                      if k.startswith("signal:")})
    features = [*LOG_FEATURES, *(f"signal:{s}" for s in signals)]
    xs: list[np.ndarray] = []
    ys: list[int] = []
    sizes: list[int] = []
    used = 0
    for q in sorted(groups):
        rel = labels.rel.get(q, {})
        rows = [r for r in groups[q] if r.pid in rel]  # the products this query's log showed
        g = grades({r.pid: rel[r.pid] for r in rows})
        if len(rows) < 2 or not any(g.values()):
            continue
        xs.append(matrix(rows, features, pop, cats))
        ys += [g[r.pid] for r in rows]
        sizes.append(len(rows))
        used += 1
    if used < 2:
        return None
    data = lightgbm.Dataset(np.vstack(xs), label=np.asarray(ys, dtype=np.float64), group=sizes,
                            feature_name=[f.replace(":", "_") for f in features], free_raw_data=False)
    booster = lightgbm.train(PARAMS, data, num_boost_round=rounds)
    report = {"queries": used, "rows": int(sum(sizes)), "chosen": int(sum(1 for y in ys if y > 0)),
              "propensity": labels.propensity, "max_ips": MAX_IPS, "rounds": rounds, "features": features,
              "popular_products": len(pop), "lightgbm": lightgbm.__version__}
    pop, cats = popularity(whole, leaves)  # served: the whole slice (leaves of the products the rows hold)
    return Ranker(booster, signals, pop, cats, report, created)


