"""Shopper events through the HTTP API: query ids, the events contract, its refusals, and learning
from the log (vitrine/feedback/intake.py, vitrine/feedback/clicks.py, vitrine/feedback/learning.py)."""

from __future__ import annotations

import time

import pytest
from conftest import engine_copy
from fastapi.testclient import TestClient

KEY = {"X-API-Key": "s3cret"}


@pytest.fixture(scope="module")
def own_engine(engine, settings_factory, encoder, tmp_path_factory):
    """A copy of the subset's data dir with an engine of its own (these tests log and learn);
    they learn when they say so (test_online_learning: the loop)."""
    eng = engine_copy(engine, settings_factory, encoder, tmp_path_factory.mktemp("events") / "data",
                      api_key="s3cret", events_key="browser-key", learn_interval_s=0,
                      learn_min_judged=1, learn_alpha=1.0,  # one head query: the mechanics, not the test
                      # the table's mechanics alone: with the test off, a learned ranker fitted on
                      # this module's one or two logged queries could win by chance and re-order the
                      # page (its own checks: tests/test_ltr.py)
                      learn_ranker=False)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def client(own_engine):
    from vitrine.web.app import create_app

    with TestClient(create_app(engine=own_engine)) as c:
        yield c


def agent(user):
    """Each shopper on a browser of their own (a client of their own to the API)."""
    return {"User-Agent": f"browser-of-{user}"}


def search(client, text, **kw):
    r = client.post("/v1/search", json={"text": text, "k": 10, **kw}, headers=agent(kw.get("user")))
    assert r.status_code == 200, r.text
    return r.json()


def test_every_search_has_a_query_id_and_events_are_taken(client, own_engine):
    res = search(client, "blue shirt", user="u1", session="s1")
    qid = res["query_id"]
    assert isinstance(qid, str) and len(qid) >= 16
    assert search(client, "blue shirt")["query_id"] != qid
    first, third = res["results"][0]["id"], res["results"][2]["id"]
    events = [{"type": "view", "query_id": qid, "product_id": first, "position": 0},
              {"type": "click", "query_id": qid, "product_id": third, "position": 2, "user": "u1", "event_id": "e-1"},
              {"type": "add_to_cart", "query_id": qid, "product_id": third, "position": 2, "timestamp": time.time()},
              {"type": "purchase", "query_id": qid, "product_id": third, "position": 2, "session": "s1"}]
    r = client.post("/v1/events", json={"events": events}, headers=KEY)
    assert r.status_code == 202 and r.json() == {"accepted": 4, "new": 4}
    # the browser's events-only key works too; the same event_id again is stored once
    r = client.post("/v1/events", json={"events": events[1:2]}, headers={"X-API-Key": "browser-key"})
    assert r.status_code == 202 and r.json() == {"accepted": 1, "new": 0}
    stored = own_engine.feedback.log.read()
    mine = [e for e in stored.events if e.query_id == qid]
    assert sorted(e.type for e in mine) == ["add_to_cart", "click", "purchase", "view"]
    assert {e.position for e in mine if e.product_id == third} == {2}
    # what the search showed is logged with it; the user token only hashed
    s = own_engine.feedback.log.searches([qid])[qid]
    assert s.ids[:3] == tuple(h["id"] for h in res["results"][:3]) and s.text == "blue shirt"
    assert s.user and s.user != "u1" and s.user == own_engine.feedback.log.hash_user("u1")


def test_a_page_counts_its_offset(client, own_engine):
    res = search(client, "shoes", offset=10)
    pid = res["results"][1]["id"]
    r = client.post("/v1/events", json={"events": [{"type": "click", "query_id": res["query_id"], "product_id": pid,
                                                    "position": 11}]}, headers=KEY)
    assert r.status_code == 202
    got = [e for e in own_engine.feedback.log.read().events if e.query_id == res["query_id"]]
    assert [e.position for e in got] == [11]


@pytest.mark.parametrize("change,status,needle", [
    ({"type": "like"}, 422, "type"),
    ({"query_id": "nope"}, 422, "query_id"),
    ({"query_id": "0000000000100000000000000000"[:27]}, 422, "retention"),
    ({"product_id": "not-on-the-page"}, 422, "product_id"),
    ({"position": -1}, 422, "position"),
    ({"colour": "red"}, 422, "colour"),
])
def test_bad_events_are_refused_naming_the_field_and_nothing_is_stored(client, own_engine, change, status, needle):
    res = search(client, "red dress")
    good = {"type": "click", "query_id": res["query_id"], "product_id": res["results"][0]["id"], "position": 0,
            "event_id": f"good-{needle}"}
    before = own_engine.feedback.log.counts()["events"]
    r = client.post("/v1/events", json={"events": [good, {**good, "event_id": None, **change}]}, headers=KEY)
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]["message"]
    assert own_engine.feedback.log.counts()["events"] == before  # all or nothing


def test_events_need_a_key_and_a_batch_has_a_limit(client, own_engine):
    res = search(client, "watch")
    ev = {"type": "click", "query_id": res["query_id"], "product_id": res["results"][0]["id"], "position": 0}
    assert client.post("/v1/events", json={"events": [ev]}).status_code == 401
    assert client.post("/v1/events", json={"events": [ev]}, headers={"X-API-Key": "wrong"}).status_code == 401
    assert client.post("/v1/events", json={"events": []}, headers=KEY).status_code == 422
    limit = own_engine.settings.feedback.events_max_batch
    r = client.post("/v1/events", json={"events": [ev] * (limit + 1)}, headers=KEY)
    assert r.status_code == 422 and "at most 1,000" in r.json()["error"]["message"]


def test_photo_search_takes_user_and_session_and_gets_a_query_id(client, subset_rows):
    from conftest import SOURCE

    pid = subset_rows[0]["id"]
    with open(SOURCE / "images" / f"{pid}.jpg", "rb") as f:
        r = client.post("/v1/search/image", files={"file": ("p.jpg", f, "image/jpeg")},
                        data={"k": "5", "user": "u9", "session": "s9"})
    assert r.status_code == 200, r.text
    assert r.json()["query_id"]


def test_tune_learns_a_head_query_from_clicks_and_leaves_other_queries_alone(client, own_engine):
    from vitrine.evals.log_tuning import tune_from_logs

    text = "casual shoes"
    other = "women handbag"
    before_other = [h["id"] for h in search(client, other)["results"]]
    base = search(client, text)["results"]
    chosen, flooded = base[7]["id"], base[5]["id"]
    for u in range(10):  # ten shoppers each choose the 8th result
        res = search(client, text, user=f"shopper-{u}")
        pos = [h["id"] for h in res["results"]].index(chosen)
        evs = [{"type": "click", "query_id": res["query_id"], "product_id": chosen, "position": pos}]
        if u % 2:
            evs.append({"type": "purchase", "query_id": res["query_id"], "product_id": chosen, "position": pos})
        assert client.post("/v1/events", json={"events": evs}, headers={**KEY, **agent(f"shopper-{u}")}).status_code == 202
    # one token floods clicks on another product: it counts once, below the bar of distinct users
    res = search(client, text, user="flooder")
    flood = [{"type": "click", "query_id": res["query_id"], "product_id": flooded, "position": 5,
              "event_id": f"f{i}"} for i in range(300)]
    assert client.post("/v1/events", json={"events": flood}, headers=KEY).status_code == 202
    got = tune_from_logs(own_engine)
    assert got.table is not None, got.report
    assert got.report["judge"]["nDCG@10_learned"] > got.report["judge"]["nDCG@10_serving"]
    boosts = got.table.queries["casual shoes"]
    assert boosts[chosen] > 0 and boosts.get(flooded, 0.0) <= 0
    after = [h["id"] for h in search(client, text, explain=True)["results"]]
    assert after[0] == chosen  # served by every worker from the data dir's learned.json
    assert [h["id"] for h in search(client, other)["results"]] == before_other
    assert any(q.text == text and chosen in q.relevant for q in got.labelled)


def test_learning_counts_each_user_once_and_needs_enough_users():
    """The click model's caps against a brute-force count on a hand-made log."""
    from vitrine.feedback import clicks
    from vitrine.feedback.types import EventRecord, FeedbackSlice, SearchLog

    now = time.time()
    searches, events = [], []
    for u in range(4):
        for rep in range(3):  # each user searches three times: one exposure each
            qid = f"q{u}-{rep}"
            searches.append(SearchLog(qid, now, "lamp", "lamp", ("a", "b", "c"), user=f"u{u}"))
            if u < 2:  # two users click c (below min_users=3), everyone passes a over
                events.append(EventRecord(f"e{u}{rep}", qid, "click", "c", 2, now, user=f"u{u}"))
    ev = clicks.gather(FeedbackSlice(searches, events), now=now)
    assert ev.exposure[("lamp", "a")] == pytest.approx(4 * 1.0)  # four users at rank 0, theta 1
    assert ev.exposure[("lamp", "c")] == pytest.approx(4 / 3)  # four users at rank 2, theta 1/3
    assert ev.success[("lamp", "c")] == pytest.approx(2.0)  # two users, one success each
    table, users, p0 = clicks.scores(ev, min_users=3)
    assert table == {}  # only two users chose anything: not a head query
    table, users, p0 = clicks.scores(ev, min_users=2)
    assert p0 == pytest.approx(2.0 / (4 + 4 / 2 + 4 / 3))
    assert table["lamp"]["c"] > 0 and table["lamp"]["a"] < 0 and users == {"lamp": 2}


def test_popular_queries_need_clicks_from_enough_users_and_results(client, own_engine):
    popular = dict(own_engine.feedback.popular_queries())
    assert popular.get("casual shoes", 0) >= 10  # ten shoppers chose from it (test above)
    assert "watch" not in popular  # searched, never chosen from
    assert all(n >= own_engine.settings.feedback.learn_min_users for n in popular.values())


def test_online_learning_loop_learns_while_serving(own_engine):
    """The API's learn loop (learn_interval_s) picks up new events and writes learned.json itself."""
    from vitrine.feedback.intake import LEARNED_FILE
    from vitrine.web.app import create_app

    (own_engine.data_dir / LEARNED_FILE).unlink(missing_ok=True)
    own_engine.settings.feedback.learn_interval_s = 0.3
    try:
        with TestClient(create_app(engine=own_engine)) as c:
            text = "sports shoes"
            target = search(c, text)["results"][6]["id"]
            for u in range(12):
                res = search(c, text, user=f"online-{u}")
                pos = [h["id"] for h in res["results"]].index(target) if target in [
                    h["id"] for h in res["results"]] else None
                if pos is not None:
                    ev = {"type": "click", "query_id": res["query_id"], "product_id": target, "position": pos}
                    assert c.post("/v1/events", json={"events": [ev]},
                                  headers={**KEY, **agent(f"online-{u}")}).status_code == 202
            deadline = time.time() + 20
            while time.time() < deadline and search(c, text, user="watcher")["results"][0]["id"] != target:
                time.sleep(0.3)
            assert search(c, text, user="watcher")["results"][0]["id"] == target
    finally:
        own_engine.settings.feedback.learn_interval_s = 0
