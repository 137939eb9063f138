"""The learned ranker (vitrine/feedback/ltr.py): inverse-propensity scored clicks against a brute
force, a ranker that learns the product position-biased shoppers prefer, its LightGBM text model's
round trip, and the acceptance rule refusing a ranker that loses on the later slice of the log; on
the conftest's real subset."""

from __future__ import annotations

import random
import time
from collections import defaultdict
from dataclasses import replace

import numpy as np
import pytest
from conftest import engine_copy

from vitrine.feedback import clicks, learning, ltr, ltr_fit
from vitrine.feedback.intake import load_learned, save_learned
from vitrine.feedback.stage import LearnedRerank
from vitrine.feedback.types import EventRecord, FeedbackSlice, SearchLog
from vitrine.search.models import SearchRequest

QUERIES = ("blue shirt", "red dress", "black shoes")


@pytest.fixture(scope="module")
def own_engine(engine, settings_factory, encoder, tmp_path_factory):
    eng = engine_copy(engine, settings_factory, encoder, tmp_path_factory.mktemp("ltr") / "data",
                      learn_interval_s=0, explore_share=0.0, learn_transfer_similarity=1.0,
                      learn_min_judged=1, learn_alpha=1.0, learn_min_users=3)
    yield eng
    eng.close()


def ids(eng, text: str, k: int = 50) -> list[str]:
    return [h.id for h in eng.search(SearchRequest(text=text, k=k)).results]


def shoppers(pages: dict[str, list[str]], liked: dict[str, str], n: int, *, t0: float, seed: int,
             tag: str) -> FeedbackSlice:
    """``n`` sessions per query, each a user of its own shown the query's page of ten: rank ``r``
    examined with 1/(r+1), the liked product clicked with 0.9 when examined, any other with 0.1."""
    rng = random.Random(seed)
    searches, events = [], []
    for i in range(n):
        for q, page in pages.items():
            qid = f"{tag}-{q}-{i}"
            ts = t0 + len(searches)
            user = f"{tag}-user-{q}-{i}"
            searches.append(SearchLog(query_id=qid, ts=ts, text=q, norm=q, ids=tuple(page), user=user, client=user))
            for r, pid in enumerate(page):
                if rng.random() < 1.0 / (r + 1) and rng.random() < (0.9 if pid == liked[q] else 0.1):
                    events.append(EventRecord(event_id=f"{qid}-{r}", query_id=qid, type="click", product_id=pid,
                                              position=r, ts=ts + 1, user=user, client=user))
    return FeedbackSlice(searches, events)


def test_ips_matches_a_brute_force_computation():
    """Per (query, product): the sum over the users who chose it of the strongest event's weight
    over the clipped 1/(rank+1) of the best rank they saw it at, divided by the users shown it."""
    rng = random.Random(5)
    searches, events = [], []
    for n in range(120):
        user = f"u{rng.randrange(15)}"
        q = rng.choice(["sofa", "lamp"])
        page = rng.sample([f"p{i}" for i in range(40)], 30)
        s = SearchLog(query_id=f"q{n}", ts=1e6 + n, text=q, norm=q, ids=tuple(page), user=user)
        searches.append(s)
        for r, pid in enumerate(page):
            if rng.random() < 0.15:
                events.append(EventRecord(event_id=f"e{n}-{r}", query_id=s.query_id,
                                          type=rng.choice(["click", "add_to_cart", "purchase"]), product_id=pid,
                                          position=r, ts=1e6 + n, user=user))
    got = ltr_fit.ips(FeedbackSlice(searches, events))
    best: dict[tuple[str, str, str], int] = {}
    for s in searches:
        for r, pid in enumerate(s.ids):
            best[(s.norm, pid, str(s.user))] = min(best.get((s.norm, pid, str(s.user)), 10**6), r)
    strongest: dict[tuple[str, str, str], float] = {}
    by_id = {s.query_id: s for s in searches}
    for e in events:
        key = (by_id[e.query_id].norm, e.product_id, str(by_id[e.query_id].user))
        strongest[key] = max(strongest.get(key, 0.0), clicks.EVENT_WEIGHT[e.type])
    total: dict[tuple[str, str], float] = defaultdict(float)
    shown: dict[tuple[str, str], int] = defaultdict(int)
    for (q, d, u), r in best.items():
        shown[(q, d)] += 1
        total[(q, d)] += strongest.get((q, d, u), 0.0) * min(r + 1.0, ltr_fit.MAX_IPS)  # 1 / clipped propensity
    assert any(r >= ltr_fit.MAX_IPS for r in best.values())  # the clip is exercised
    assert {(q, d) for q, rel in got.rel.items() for d in rel} == set(shown)
    for (q, d), n in shown.items():
        assert got.rel[q][d] == pytest.approx(total[(q, d)] / n, rel=1e-12)
        assert got.shown[q][d] == n
    for d in {d for _, d in shown}:
        assert got.ips_sum[d] == pytest.approx(sum(v for (_, dd), v in total.items() if dd == d), rel=1e-12)
    assert ltr_fit.grades({"a": 0.0, "b": 0.2, "c": 1.0, "d": 0.5}) == {"a": 0, "b": 1, "c": 4, "d": 2}


def test_ranker_learns_the_product_shoppers_prefer_and_round_trips(own_engine, tmp_path):
    """Shoppers who examine rank r with 1/(r+1) prefer the tenth product of each query's page: raw
    clicks favour the first product, the IPS estimate the tenth; the ranker trained on them puts the
    tenth first, and its text model and config round-trip bit-identically."""
    eng = own_engine
    learned = eng.stage(LearnedRerank).learned
    pages = {q: ids(eng, q, 10) for q in QUERIES}
    liked = {q: pages[q][9] for q in QUERIES}
    fb = shoppers(pages, liked, 150, t0=time.time() - 3600, seed=1, tag="pref")
    raw: dict[tuple[str, str], int] = defaultdict(int)
    for e in fb.events:
        raw[(e.query_id.split("-")[1], e.product_id)] += 1
    ev = ltr_fit.ips(fb)
    assert any(raw[(q, pages[q][0])] > raw[(q, liked[q])] for q in QUERIES)  # position bias in the raw clicks
    for q in QUERIES:
        assert max(ev.rel[q], key=ev.rel[q].__getitem__) == liked[q]
    table = clicks.learn(fb, min_users=3)
    texts = {q: q for q in QUERIES}
    fs = eng.settings.feedback
    kw = {"min_users": 3, "em": False, "bot_per_minute": fs.bot_events_per_minute}
    ranker = learning.train_ranker(lambda t: ids(eng, t), learned, fb, fs, texts, kw, time.time())
    assert ranker is not None and ranker.report["queries"] == len(QUERIES)
    rows = learning.pool_rows(lambda t: ids(eng, t), learned, table, list(QUERIES), texts)
    for q in QUERIES:
        shown = [r for r in rows[q] if r.pid in pages[q]]
        scores = ranker.predict(shown)
        assert shown[int(np.argmax(scores))].pid == liked[q]
    learned.pin(replace(table, ranker=ranker))
    try:
        for q in QUERIES:
            assert ids(eng, q, 10)[0] == liked[q]
    finally:
        learned.unpin()
    # round trip: LightGBM's text format and a JSON config, the same bytes and the same scores
    folder = ranker.save(tmp_path / "ltr")
    back = ltr.load(folder)
    assert back.model_text() == ranker.model_text()
    assert back.config() == ranker.config()
    again = back.save(tmp_path / "ltr2")
    for name in (ltr.MODEL_FILE, ltr.CONFIG_FILE):
        assert (again / name).read_bytes() == (folder / name).read_bytes()
    assert not list(tmp_path.rglob("*.pkl")) and not list(tmp_path.rglob("*.pickle"))
    sample = [r for q in QUERIES for r in rows[q]]
    assert np.array_equal(back.predict(sample), ranker.predict(sample))
    # served from the data dir: learned.json names the ranker, a fresh load scores the same
    eng_dir = eng.data_dir
    save_learned(eng_dir, replace(table, ranker=ranker))
    try:
        served = load_learned(eng_dir)
        assert served is not None and served.ranker is not None
        assert np.array_equal(served.ranker.predict(sample), ranker.predict(sample))
    finally:
        (eng_dir / "learned.json").unlink()
        learned.reload()


def test_acceptance_refuses_a_ranker_that_loses_on_the_later_slice(own_engine):
    """Shoppers preferred the tenth product, then (the later slice) the second: what the earlier
    part taught loses there, so neither the ranker nor the table is served."""
    eng = own_engine
    learned = eng.stage(LearnedRerank).learned
    (eng.data_dir / "learned.json").unlink(missing_ok=True)
    learned.reload()
    pages = {q: ids(eng, q, 10) for q in QUERIES}
    now = time.time()
    early = shoppers(pages, {q: pages[q][9] for q in QUERIES}, 70, t0=now - 7200, seed=2, tag="early")
    late = shoppers(pages, {q: pages[q][1] for q in QUERIES}, 30, t0=now - 1800, seed=3, tag="late")
    log_ = eng.feedback.log
    for s in early.searches + late.searches:
        log_.log_search(s)
    log_.add_events(early.events + late.events)
    res = eng.learn_from_log(now=now)
    judged = res.report["judge"]
    assert judged["queries"] == len(QUERIES)
    assert "ranker" in judged and judged["ranker"]["kept"] is False
    assert judged["ranker"]["nDCG@10_learned_ranker"] < judged["nDCG@10_serving"]
    assert res.table is None and load_learned(eng.data_dir) is None
    assert res.full is not None and res.full.ranker is not None  # learned, not served
