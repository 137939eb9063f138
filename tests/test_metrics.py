"""Every metric checked against a brute-force reference on seeded random data."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vitrine import metrics as M


def brute_recall(ranked, rel, k):
    relevant = [d for d, g in rel.items() if g > 0]
    if not relevant:
        return 0.0
    found = 0
    for d in relevant:
        for pos in range(min(k, len(ranked))):
            if ranked[pos] == d:
                found += 1
                break
    return found / len(relevant)


def brute_precision(ranked, rel, k):
    return sum(1 for pos in range(min(k, len(ranked))) if rel.get(ranked[pos], 0) > 0) / k


def brute_mrr(ranked, rel, k):
    best = 0.0
    for pos in range(min(k, len(ranked))):
        if rel.get(ranked[pos], 0) > 0:
            best = max(best, 1.0 / (pos + 1))
    return best


def brute_dcg(gains):
    return sum((2 ** g - 1) / math.log2(i + 2) for i, g in enumerate(gains))


def brute_ndcg(ranked, rel, k):
    # ideal = the best DCG over every ordering of every choice of k judged documents
    judged = [g for g in rel.values() if g > 0]
    best = 0.0
    for perm in itertools.permutations(judged, min(k, len(judged))):
        best = max(best, brute_dcg(perm))
    if best == 0:
        return 0.0
    return brute_dcg([rel.get(d, 0) for d in ranked[:k]]) / best


def brute_ap(ranked, rel, k):
    relevant = {d for d, g in rel.items() if g > 0}
    if not relevant:
        return 0.0
    precs = []
    for pos in range(min(k, len(ranked))):
        if ranked[pos] in relevant:
            precs.append(brute_precision(ranked, rel, pos + 1) * (pos + 1) / (pos + 1))
    return sum(precs) / min(k, len(relevant))


def brute_hit(ranked, rel, k):
    return float(brute_recall(ranked, rel, k) > 0)


CASES = [
    (M.recall_at_k, brute_recall), (M.precision_at_k, brute_precision), (M.mrr_at_k, brute_mrr),
    (M.ndcg_at_k, brute_ndcg), (M.average_precision_at_k, brute_ap), (M.hit_at_k, brute_hit),
]

docs = st.integers(min_value=0, max_value=12)


@settings(max_examples=300, deadline=None)
@given(
    ranked=st.lists(docs, max_size=10, unique=True),
    rel=st.dictionaries(docs, st.integers(min_value=0, max_value=3), max_size=6),
    k=st.integers(min_value=1, max_value=8),
)
@pytest.mark.parametrize("fast,brute", CASES, ids=[c[0].__name__ for c in CASES])
def test_metric_matches_brute_force(fast, brute, ranked, rel, k):
    assert fast(ranked, rel, k) == pytest.approx(brute(ranked, rel, k), abs=1e-9)


def test_seeded_random_runs_against_brute_force():
    rng = random.Random(1234)
    for _ in range(200):
        pool = list(range(30))
        ranked = rng.sample(pool, rng.randint(0, 15))
        rel = {d: rng.randint(1, 3) for d in rng.sample(pool, rng.randint(1, 5))}
        k = rng.randint(1, 10)
        for fast, brute in CASES:
            assert fast(ranked, rel, k) == pytest.approx(brute(ranked, rel, k), abs=1e-9)


def test_known_values():
    assert M.recall_at_k(["a", "b", "c"], {"b": 1, "z": 1}, 2) == 0.5
    assert M.mrr_at_k(["a", "b", "c"], {"c": 1}, 3) == pytest.approx(1 / 3)
    assert M.mrr_at_k(["a", "b", "c"], {"c": 1}, 2) == 0.0
    assert M.ndcg_at_k(["a", "b"], {"a": 1}, 10) == 1.0
    assert M.precision_at_k(["a"], {"a": 1}, 10) == 0.1
    assert M.ndcg_at_k(["x"], {}, 5) == 0.0


def test_mean_metrics_keys_and_average():
    runs = [(["a", "b"], {"a": 1}), (["b", "a"], {"a": 1})]
    m = M.mean_metrics(runs, [1, 2], ("R", "MRR"))
    assert set(m) == {"R@1", "R@2", "MRR@1", "MRR@2"}
    assert m["R@1"] == 0.5 and m["R@2"] == 1.0 and m["MRR@2"] == pytest.approx(0.75)


def brute_linear_ndcg(ranked, gains, k):
    """nDCG@k with linear real-valued gains: the ideal is the best DCG over every ordering of
    every choice of k gained products (the learning judge's and the session eval's nDCG)."""
    def dcg(gs):
        return sum(g / math.log2(i + 2) for i, g in enumerate(gs))

    best = max((dcg(p) for p in itertools.permutations([g for g in gains.values() if g > 0],
                                                        min(k, sum(g > 0 for g in gains.values())))), default=0.0)
    return dcg([gains.get(d, 0.0) for d in ranked[:k]]) / best if best > 0 else 0.0


def test_linear_gain_ndcg_against_brute_force():
    rng = random.Random(77)
    for _ in range(200):
        pool = [f"p{i}" for i in range(25)]
        ranked = rng.sample(pool, rng.randint(0, 12))
        gains = {d: rng.choice([0.0, rng.random() * 3]) for d in rng.sample(pool, rng.randint(1, 6))}
        k = rng.randint(1, 10)
        assert M.ndcg_at_k(ranked, gains, k, gain="linear") == pytest.approx(brute_linear_ndcg(ranked, gains, k),
                                                                             abs=1e-9)
