"""Experiments that can be read at any time: A/A stays "not significant" when the report is read at
ten interim looks (the always-valid mSPRT), a true effect is found, an injected sample-ratio
mismatch is flagged and withholds the verdict, Holm's correction and the mSPRT p-value agree with
brute-force computations, alpha and min_units are the experiment's own settings (through the HTTP
API), and a staged rollout with three variants never moves a shopper out of a variant whose share
does not shrink."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from conftest import engine_copy
from fastapi.testclient import TestClient
from test_experiments import synthetic_units

KEY = {"X-API-Key": "trust-x"}


def _exp(names=("A", "B"), split=None, **kw):
    from vitrine.experiments.models import Experiment, VariantSettings

    split = split or [100 / len(names)] * len(names)
    return Experiment(name="t", variants={n: VariantSettings() for n in names}, split=split, created=0.0,
                      history=[{"ts": 0.0, "split": split}], **kw)


def test_a_a_is_not_significant_at_any_of_ten_looks_and_a_true_effect_is_found():
    from vitrine.experiments.stats import analyse

    rng = random.Random(11)
    false_any = found = 0
    runs, looks, users = 100, 10, 400
    for _ in range(runs):
        a = synthetic_units(rng, "A", users, 0.30)
        b = synthetic_units(rng, "B", users, 0.30)
        hit = False
        for look in range(1, looks + 1):  # the report read after every tenth of the traffic
            m = users * look // looks
            hit |= analyse(_exp(), a[:m] + b[:m]).winner is not None
        false_any += hit
    for _ in range(20):
        a = synthetic_units(rng, "A", 1000, 0.30)
        b = synthetic_units(rng, "B", 1000, 0.40)
        found += analyse(_exp(), a + b).winner == "B"
    assert false_any / runs <= 0.05, false_any  # at most alpha over all ten looks together
    assert found / 20 >= 0.8, found


def test_a_fixed_horizon_test_read_ten_times_would_have_failed():
    """Why the verdict is sequential: the classical p-value (still reported, for reference) read at
    each look declares far more A/A runs significant than alpha."""
    from vitrine.experiments.stats import analyse

    rng = random.Random(12)
    peeking = 0
    for _ in range(100):
        a = synthetic_units(rng, "A", 300, 0.30)
        b = synthetic_units(rng, "B", 300, 0.30)
        peeking += any(min(c.p_fixed_horizon for c in analyse(_exp(), a[:m] + b[:m]).comparisons
                           if c.metric in ("ctr", "conversion", "mrr") and c.p_fixed_horizon is not None) < 0.05 / 3
                       for m in range(30, 301, 30))
    assert peeking >= 8  # well above the 5% an honest test keeps


def test_srm_is_flagged_and_withholds_the_verdict():
    from scipy import stats

    from vitrine.experiments.stats import analyse

    rng = random.Random(13)
    rows = synthetic_units(rng, "A", 600, 0.30) + synthetic_units(rng, "B", 450, 0.45)
    rep = analyse(_exp(), rows)
    srm = rep.sample_ratio
    assert srm.mismatch and srm.observed == {"A": 600, "B": 450}
    assert srm.p_value == pytest.approx(stats.chisquare([600, 450]).pvalue, rel=1e-4)
    assert rep.winner is None and rep.verdict.startswith("no verdict: sample ratio mismatch")
    ok = analyse(_exp(), synthetic_units(rng, "A", 500, 0.3) + synthetic_units(rng, "B", 490, 0.3))
    assert not ok.sample_ratio.mismatch and ok.sample_ratio.p_value > 0.5
    # brute force: the chi-square statistic by hand
    chi = sum((o - 525) ** 2 / 525 for o in (600, 450))
    assert srm.p_value == pytest.approx(math.erfc(math.sqrt(chi / 2)), rel=1e-4)  # 1 degree of freedom


def test_holm_and_msprt_against_brute_force():
    from scipy import integrate, stats

    from vitrine.experiments.stats import holm, msprt_p

    rng = random.Random(14)
    for _ in range(30):
        ps = [rng.random() ** 3 for _ in range(rng.randint(1, 6))]
        got = holm(ps)
        # brute force: the closed testing procedure over Bonferroni-tested intersections
        m = len(ps)
        for i in range(m):
            want = max(min(1.0, len(s) * min(ps[j] for j in s))
                       for r in range(1, m + 1) for s in itertools.combinations(range(m), r) if i in s)
            assert got[i] == pytest.approx(want)
    for d, se, tau in [(0.0, 0.02, 0.03), (0.05, 0.02, 0.03), (-0.08, 0.03, 0.01), (0.01, 0.001, 0.05)]:
        v = se * se
        num, _ = integrate.quad(lambda t: stats.norm.pdf(d, t, se) * stats.norm.pdf(t, 0, tau), -1, 1,
                                points=[0, d], limit=200)
        lr = num / stats.norm.pdf(d, 0, se)
        assert msprt_p(d, se, tau) == pytest.approx(min(1.0, 1 / lr), rel=1e-4), (d, se, tau, v)


def test_rebucketing_three_variants_moves_no_one_out_of_a_growing_variant():
    from vitrine.experiments.runner import BUCKETS, bucket_counts, first_buckets, rebucket

    steps = [[90, 5, 5], [80, 10, 10], [80, 5, 15], [60, 15, 25], [34, 33, 33]]
    b = first_buckets(steps[0])
    assert len(b) == BUCKETS and [b.count(i) for i in range(3)] == bucket_counts(steps[0])
    for old, new in zip(steps, steps[1:]):
        nb = rebucket(b, new)
        assert [nb.count(i) for i in range(3)] == bucket_counts(new)
        for i in range(3):
            if new[i] >= old[i]:  # kept or grew: every bucket it had is still its own
                assert all(nb[j] == i for j in range(BUCKETS) if b[j] == i)
            else:  # shrank: it only lost buckets
                assert all(b[j] == i for j in range(BUCKETS) if nb[j] == i)
        b = nb


@pytest.fixture(scope="module")
def client(engine, settings_factory, encoder, tmp_path_factory):
    from vitrine.web.app import create_app

    eng = engine_copy(engine, settings_factory, encoder, tmp_path_factory.mktemp("trust-x") / "data",
                      api_key="trust-x")
    with TestClient(create_app(engine=eng)) as c:
        yield c, eng
    eng.close()


def test_settings_and_a_three_variant_rollout_through_the_api(client):
    from vitrine.search.models import SearchRequest

    c, eng = client
    body = {"name": "three", "variants": {"A": {}, "B": {"learn_weight": 0}, "C": {"calibration": "floor"}},
            "split": [90, 5, 5], "alpha": 0.01, "min_units": 50}
    r = c.post("/v1/experiments", json=body, headers=KEY)
    assert r.status_code == 201, r.text
    assert r.json()["alpha"] == 0.01 and r.json()["min_units"] == 50
    assert c.post("/v1/experiments", json={**body, "name": "bad", "alpha": 0.7}, headers=KEY).status_code == 422
    users = [f"user-{i}" for i in range(4000)]

    def where() -> dict[str, str]:
        ex = eng.experiments
        ex.all(fresh=True)
        return {u: ex.assign(SearchRequest(text="shirt", user=u)).variant for u in users}

    before = where()
    for split in ([80, 10, 10], [60, 15, 25], [34, 33, 33]):
        assert c.patch("/v1/experiments/three/split", json={"split": split}, headers=KEY).status_code == 200
        now = where()
        for u in users:  # B and C only grow: their shoppers never leave
            if before[u] in ("B", "C"):
                assert now[u] == before[u], (u, before[u], now[u], split)
        shares = {v: sum(x == v for x in now.values()) / len(users) for v in "ABC"}
        for v, s in zip("ABC", split):
            assert abs(shares[v] - s / 100) < 0.03, (shares, split)
        before = now
    rep = c.get("/v1/experiments/three", headers=KEY).json()
    assert rep["alpha"] == 0.01 and "too few users" in rep["verdict"] and "at least 50" in rep["verdict"]
    assert rep["sample_ratio"] is None  # the split changed: units were drawn under several splits
    c.post("/v1/experiments/three/stop", headers=KEY)
