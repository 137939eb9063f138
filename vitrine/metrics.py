"""Retrieval metrics as pure functions over ids (no models, no I/O), as faiss.contrib does.

``ranked`` is the ordered list of retrieved ids for one query; ``relevant`` maps relevant
ids to graded relevance (> 0). Every function returns a float in [0, 1]. ``mean_metrics``
averages them over queries.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

# id -> graded relevance; the ids are any hashable (Any: Mapping is invariant in its key type, so
# Mapping[Hashable, float] would refuse the dict[int, float] and dict[str, float] callers pass)
Relevance = Mapping[Any, float]


def _rel_set(relevant: Relevance) -> set[Hashable]:
    return {i for i, g in relevant.items() if g > 0}


def recall_at_k(ranked: Sequence[Hashable], relevant: Relevance, k: int) -> float:
    """Fraction of relevant items found in the top k."""
    rel = _rel_set(relevant)
    if not rel:
        return 0.0
    return len(rel.intersection(ranked[:k])) / len(rel)


def hit_at_k(ranked: Sequence[Hashable], relevant: Relevance, k: int) -> float:
    """1 if any relevant item is in the top k (the KAGL protocol's "recall")."""
    rel = _rel_set(relevant)
    return 1.0 if any(r in rel for r in ranked[:k]) else 0.0


def precision_at_k(ranked: Sequence[Hashable], relevant: Relevance, k: int) -> float:
    """Fraction of the top k that is relevant (missing ranks count as not relevant)."""
    rel = _rel_set(relevant)
    return sum(1 for r in ranked[:k] if r in rel) / k


def mrr_at_k(ranked: Sequence[Hashable], relevant: Relevance, k: int) -> float:
    """Reciprocal rank of the first relevant item within the top k (0 if none)."""
    rel = _rel_set(relevant)
    for i, r in enumerate(ranked[:k]):
        if r in rel:
            return 1.0 / (i + 1)
    return 0.0


GAINS = ("exponential", "linear")


def dcg_at_k(gains: Sequence[float], k: int, gain: str = "exponential") -> float:
    """Discounted cumulative gain: with ``gain="exponential"`` a grade g earns 2^g - 1 (Burges et
    al.), with ``"linear"`` it earns g (Järvelin & Kekäläinen; WANDS's figures: exact 2 counts
    twice a partial 1, i.e. 1 and 0.5 once normalised). Binary grades give the same DCG either way."""
    if gain == "linear":
        return sum(float(g) / math.log2(i + 2) for i, g in enumerate(gains[:k]))
    if gain != "exponential":
        raise ValueError(f"gain must be one of {GAINS}, not {gain!r}")
    return sum((2.0 ** g - 1.0) / math.log2(i + 2) for i, g in enumerate(gains[:k]))


def ndcg_at_k(ranked: Sequence[Hashable], relevant: Relevance, k: int, gain: str = "exponential") -> float:
    """DCG of the ranking over the DCG of the ideal ranking (``gain``: see :func:`dcg_at_k`)."""
    ideal = sorted((g for g in relevant.values() if g > 0), reverse=True)
    idcg = dcg_at_k(ideal, k, gain)
    if idcg == 0:
        return 0.0
    gains = [float(relevant.get(r, 0.0)) for r in ranked[:k]]
    return dcg_at_k(gains, k, gain) / idcg


def average_precision_at_k(ranked: Sequence[Hashable], relevant: Relevance, k: int) -> float:
    """AP@k: mean of precision at each relevant rank, over min(k, |relevant|)."""
    rel = _rel_set(relevant)
    if not rel:
        return 0.0
    hits, total = 0, 0.0
    for i, r in enumerate(ranked[:k]):
        if r in rel:
            hits += 1
            total += hits / (i + 1)
    return total / min(k, len(rel))


METRICS = {
    "R": recall_at_k,
    "Hit": hit_at_k,
    "P": precision_at_k,
    "MRR": mrr_at_k,
    "nDCG": ndcg_at_k,
    "mAP": average_precision_at_k,
}


def mean_metrics(
    runs: Sequence[tuple[Sequence[Hashable], Relevance]],
    ks: Sequence[int],
    names: Sequence[str] = ("R", "MRR", "nDCG"),
    gain: str = "exponential",
) -> dict[str, float]:
    """Average each named metric at each k over (ranked, relevant) pairs: keys like ``R@10``
    (``gain``: nDCG's gain, see :func:`dcg_at_k`)."""
    out: dict[str, float] = {}
    n = len(runs)
    for name in names:
        fn = METRICS[name]
        for k in ks:
            if name == "nDCG":
                out[f"{name}@{k}"] = sum(ndcg_at_k(r, rel, k, gain) for r, rel in runs) / n if n else 0.0
            else:
                out[f"{name}@{k}"] = sum(fn(r, rel, k) for r, rel in runs) / n if n else 0.0
    return out


def totals_within(runs: Sequence[tuple[Sequence[Hashable], Relevance, int]], depth: int) -> dict[str, float]:
    """How well a search's ``total`` (the head of its ranking that counts as matching) holds what
    shoppers judged relevant, over (ranked, relevant, total) triples, each ranking ``depth`` deep;
    the head is the top ``total`` of those. Relevant: the qrels' top grade (WANDS's *exact*; 1 in
    binary qrels).

    - ``recall``: of the relevant products in the top ``depth``, the share within the head, pooled
      over queries (``recall_mean``: the mean of each query's share);
    - ``recall_judged``: of every relevant product (at most ``depth`` per query), the share within
      the head, pooled: a ranking that never reaches a relevant product is blamed too;
    - ``precision``: the relevant share of the head, the mean over queries whose total is not 0;
      ``precision_any``: the same counting any grade above 0 (exact or partial). Unjudged products
      count as not relevant, so both are lower bounds."""
    found = within = judged = 0
    recalls: list[float] = []
    precisions: list[float] = []
    any_grade: list[float] = []
    for ranked, rel, total in runs:
        top = max((g for g in rel.values() if g > 0), default=0)
        if top <= 0:
            continue
        grades = [rel.get(p, 0) for p in list(ranked)[:depth]]
        hits = [g >= top for g in grades]
        head = min(total, len(grades))
        n, n_head = sum(hits), sum(hits[:head])
        found, within = found + n, within + n_head
        judged += min(depth, sum(1 for g in rel.values() if g >= top))
        if n:
            recalls.append(n_head / n)
        if head:
            precisions.append(n_head / head)
            any_grade.append(sum(1 for g in grades[:head] if g > 0) / head)
    return {"recall": within / found if found else 0.0,
            "recall_mean": sum(recalls) / len(recalls) if recalls else 0.0,
            "recall_judged": within / judged if judged else 0.0,
            "precision": sum(precisions) / len(precisions) if precisions else 0.0,
            "precision_any": sum(any_grade) / len(any_grade) if any_grade else 0.0,
            "queries": float(len(precisions))}
