"""Learning past the page (vitrine/feedback/rocchio.py, vitrine/feedback/explore.py), the click
model's inverse-propensity weights (vitrine/feedback/clicks.py) and the simulator's one page of
ten (vitrine/evals/simulate.py), on the conftest's real subset through the real API."""

from __future__ import annotations

import random
from collections import defaultdict

import numpy as np
import pytest
from conftest import engine_copy
from fastapi.testclient import TestClient

from vitrine.feedback import clicks
from vitrine.feedback import explored as explored_log
from vitrine.feedback.intake import LearnedTable, save_learned
from vitrine.feedback.stage import LearnedRerank
from vitrine.feedback.types import EventRecord, FeedbackSlice, SearchLog
from vitrine.search.models import SearchRequest

KEY = {"X-API-Key": "s3cret"}


@pytest.fixture(scope="module")
def own_engine(engine, settings_factory, encoder, tmp_path_factory):
    eng = engine_copy(engine, settings_factory, encoder, tmp_path_factory.mktemp("past") / "data",
                      api_key="s3cret", learn_interval_s=0, explore_share=0.0, learn_rocchio_weight=1.0,
                      learn_transfer_similarity=1.0)
    yield eng
    eng.close()


def ids(eng, text: str, k: int = 100) -> list[str]:
    return [h.id for h in eng.search(SearchRequest(text=text, k=k)).results]


def serve(eng, table: LearnedTable | None) -> None:
    learned = eng.stage(LearnedRerank).learned
    if table is None:
        (eng.data_dir / "learned.json").unlink(missing_ok=True)
    else:
        save_learned(eng.data_dir, table)
    learned.reload()


def test_rocchio_lifts_an_unshown_product_like_the_chosen_ones(own_engine):
    """Shoppers chose three products of a query; a product nobody was shown (below the page, in
    no table), the nearest to them in the text tower's space, rises, while a query nobody
    logged (transfer off here) ranks exactly as before."""
    eng = own_engine
    serve(eng, None)
    query, other = "blue shirt", "black leather bag"
    before, other_before = ids(eng, query), ids(eng, other)
    state = eng.reader.state
    target = before[30]
    t_iid = state.records.get(target).iid
    t_vec = state.native.index.get([t_iid])[0]
    _, near = state.native.index.search(t_vec[None].astype(np.float32), 8, None)
    by_iid = {r.iid: p for p, r in state.records.get_many(before).items()}
    chosen = [by_iid[int(i)] for i in near[0].tolist() if int(i) != t_iid and int(i) in by_iid][:3]
    assert len(chosen) == 3 and target not in chosen
    serve(eng, LearnedTable(queries={query: {p: 1.0 for p in chosen}}, users={query: 5}, created=1e18))
    try:
        after = ids(eng, query)
        assert target in after and after.index(target) < before.index(target)
        assert ids(eng, other) == other_before  # never logged, no transfer: the ranking as served cold
        # off: what the click re-ranking alone does (target not in the table: it does not move up)
        eng.settings.feedback.learn_rocchio_weight = 0.0
        plain = ids(eng, query)
        assert target not in plain[:before.index(target)]
    finally:
        eng.settings.feedback.learn_rocchio_weight = 1.0
        serve(eng, None)


def test_ips_exposures_and_successes_match_a_brute_force_count():
    """Each user's best rank of a (query, product) counts 1/(rank+1) of an examination (the PBM
    prior: its inverse-propensity weight), each user's strongest event once."""
    rng = random.Random(3)
    now = 1_000_000.0
    searches, events = [], []
    for n in range(60):
        user = f"u{rng.randrange(12)}"
        q = rng.choice(["sofa", "lamp"])
        page = rng.sample([f"p{i}" for i in range(15)], 10)
        s = SearchLog(query_id=f"q{n}", ts=now, text=q, norm=q, ids=tuple(page), user=user)
        searches.append(s)
        for r, pid in enumerate(page):
            if rng.random() < 0.2:
                typ = rng.choice(["click", "add_to_cart", "purchase"])
                events.append(EventRecord(event_id=f"e{n}-{r}", query_id=s.query_id, type=typ, product_id=pid,
                                          position=r, ts=now, user=user))
    ev = clicks.gather(FeedbackSlice(searches, events), now=now)
    best: dict[tuple[str, str, str], int] = {}
    for s in searches:
        for r, pid in enumerate(s.ids):
            key = (s.norm, pid, str(s.user))
            best[key] = min(best.get(key, 99), r)
    exposure: dict[tuple[str, str], float] = defaultdict(float)
    for (q, d, _), r in best.items():
        exposure[(q, d)] += 1.0 / (r + 1.0)
    strongest: dict[tuple[str, str, str], float] = {}
    by_id = {s.query_id: s for s in searches}
    for e in events:
        s = by_id[e.query_id]
        key = (s.norm, e.product_id, str(s.user))
        strongest[key] = max(strongest.get(key, 0.0), clicks.EVENT_WEIGHT[e.type])
    success: dict[tuple[str, str], float] = defaultdict(float)
    for (q, d, _), w in strongest.items():
        success[(q, d)] += w
    assert set(ev.exposure) == set(exposure)
    for key, v in exposure.items():
        assert ev.exposure[key] == pytest.approx(v)
    assert {k: v for k, v in ev.success.items() if v} == pytest.approx(dict(success))


def test_exploration_share_is_respected_and_logged_with_its_propensity(own_engine):
    eng = own_engine
    serve(eng, None)
    eng.settings.feedback.explore_share = 0.5
    eng.settings.feedback.explore_head_searches = 1
    from vitrine.web.app import create_app

    try:
        natural = ids(eng, "red dress", 50)  # k=50 (and no user): never explored
        with TestClient(create_app(engine=eng)) as c:
            n, explored, first = 200, [], None
            for i in range(n):
                r = c.post("/v1/search", json={"text": "red dress", "k": 10, "user": f"shopper-{i}"})
                assert r.status_code == 200, r.text
                body = r.json()
                page = [h["id"] for h in body["results"]]
                assert len(page) == 10
                ex = body.get("exploration")
                if ex is None:
                    assert page == natural[:10]
                    continue
                explored.append(ex)
                assert page[ex["position"]] == ex["product_id"] == natural[ex["from_rank"]]
                assert 10 <= ex["from_rank"] < 50
                assert ex["propensity"] == pytest.approx(0.5 / 40 / 10)
                first = first or (body["query_id"], ex)
            # 0.5 of 200: within four standard deviations (sd 7.1)
            assert abs(len(explored) - n * 0.5) <= 4 * (n * 0.25) ** 0.5
            # anonymous searches are never explored
            assert all(c.post("/v1/search", json={"text": "red dress", "k": 10}).json().get("exploration") is None
                       for _ in range(20))
            assert first is not None
            qid, ex = first
            r = c.post("/v1/events", headers=KEY, json={"events": [
                {"type": "click", "query_id": qid, "product_id": ex["product_id"], "position": ex["position"]}]})
            assert r.status_code == 202, r.text
            got = c.get("/v1/analytics", headers=KEY).json()["exploration"]
            assert got["impressions"] == len(explored) and got["clicks"] == 1
        logged = [s for s in eng.feedback.log.read().searches if s.experiment == explored_log.EXPERIMENT]
        assert len(logged) == len(explored)
        tag = explored_log.Explored.of_variant("", logged[0].variant or "")
        assert tag is not None and tag.propensity == pytest.approx(0.5 / 40 / 10)
    finally:
        eng.settings.feedback.explore_share = 0.0


def test_simulated_shoppers_see_one_page_of_ten(own_engine):
    """Shoppers who examine every rank and click everything still click only the ten shown."""
    from vitrine.evals import simulate as sim
    from vitrine.web.app import create_app

    serve(eng := own_engine, None)
    deep = ids(eng, "blue jeans", 50)
    q = sim.JudgedQuery("q", "blue jeans", {p: 1.0 for p in deep})
    shopper = sim.Shopper(eta=0.0, click_floor=1.0, click_ceiling=1.0)
    assert len(shopper.page(list(range(50)))) == 10
    with TestClient(create_app(engine=eng)) as c:
        out = sim.simulate(c, [q], 3, key="s3cret", shopper=shopper)
    assert out.searches == 3 and out.clicks == 30
    positions = {e.position for e in eng.feedback.log.read().events if e.type == "click"}
    assert positions <= set(range(10))
