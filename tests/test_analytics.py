"""Merchant analytics (vitrine/feedback/analytics.py): every figure of GET /v1/analytics and
`vitrine analytics` against a brute-force count in Python over the raw log rows, on a log made
through the HTTP API and on a large synthetic one; SQLite and PostgreSQL agree on the same log."""

from __future__ import annotations

import json
import random
import time
from collections import defaultdict

from conftest import engine_and_client

KEY = {"X-API-Key": "s3cret"}
DAY = 86400.0


# -- the brute force: plain Python over the raw rows ------------------------------------------------
def brute(searches, events, since, until, bucket_s=DAY, top=20):
    """Every analytics figure recomputed from the raw searches and events, independently of the SQL."""
    ss = [s for s in searches if since <= s.ts < until]
    by_q = defaultdict(list)
    for e in events:
        by_q[e.query_id].append(e)

    def figs(group):
        n = len(group)
        types = [{e.type for e in by_q[s.query_id]} for s in group]
        clicks = [e.position for s in group for e in by_q[s.query_id] if e.type == "click"]
        clicked = sum("click" in t for t in types)
        carted = sum("add_to_cart" in t for t in types)
        bought = sum("purchase" in t for t in types)
        nores = sum(1 for s in group if s.total == 0 or not s.ids)
        def r(a: int) -> float | None:
            return round(a / n, 6) if n else None
        # the synthetic logs hold first pages only, each a search of its own (pages: tests/test_trust_analytics.py)
        return {"searches": n, "pages": n, "users": len({s.user for s in group if s.user}), "no_results": nores,
                "clicked": clicked, "added_to_cart": carted, "purchased": bought, "clicks": len(clicks),
                "ctr": r(clicked), "add_to_cart_rate": r(carted), "conversion": r(bought), "no_result_rate": r(nores),
                "mean_click_position": round(1 + sum(clicks) / len(clicks), 6) if clicks else None}

    buckets = defaultdict(list)
    queries = defaultdict(list)
    for s in ss:
        buckets[int(s.ts // bucket_s)].append(s)
        queries[s.norm].append(s)
    top_q = sorted(queries, key=lambda q: (-len(queries[q]), q.encode()))[:top]
    return {
        "distinct_queries": len(queries), "totals": figs(ss),
        "series": [{"start": b * bucket_s, **figs(g)} for b, g in sorted(buckets.items())],
        "top_queries": [{"query": q, **figs(queries[q])} for q in top_q],
    }


def fix_no_results(expected, searches, since, until, top=20):
    """Queries with no results count only their empty searches (a query that found nothing once)."""
    groups = defaultdict(list)
    for s in searches:
        if since <= s.ts < until and (s.total == 0 or not s.ids):
            groups[s.norm].append(s)
    got = sorted(groups.items(), key=lambda t: (-len(t[1]), t[0].encode()))[:top]
    expected["no_result_queries"] = [{"query": q, "searches": len(g), "users": len({s.user for s in g if s.user})}
                                     for q, g in got]
    return expected


def no_click_queries(searches, events, since, until, top=20):
    """Queries whose searches with results never got a click (counted over those searches)."""
    clicked = {e.query_id for e in events if e.type == "click"}
    groups = defaultdict(list)
    for s in searches:
        if since <= s.ts < until and not (s.total == 0 or not s.ids):
            groups[s.norm].append(s)
    got = [(q, g) for q, g in groups.items() if not any(s.query_id in clicked for s in g)]
    got.sort(key=lambda t: (-len(t[1]), t[0].encode()))
    return [{"query": q, "searches": len(g), "users": len({s.user for s in g if s.user})} for q, g in got[:top]]


def expected_report(searches, events, since, until, bucket_s=DAY, top=20):
    exp = fix_no_results(brute(searches, events, since, until, bucket_s, top), searches, since, until, top)
    exp["no_click_queries"] = no_click_queries(searches, events, since, until, top)
    return exp


def comparable(rep: dict) -> dict:
    """The report without what the brute force does not make (dates as text, the window)."""
    out = {k: rep[k] for k in ("distinct_queries", "totals", "top_queries", "no_result_queries", "no_click_queries")}
    out["series"] = [{k: v for k, v in b.items() if k != "date"} for b in rep["series"]]
    return out


def synthetic_log(n_searches=3000, seed=0, days=5):
    """A log with known structure: several days, repeated queries, users, empty pages, every event type."""
    from vitrine.feedback.types import EventRecord, SearchLog
    from vitrine.index.querytext import normalise_query

    rng = random.Random(seed)
    t0 = 1_699_920_000.0  # a UTC midnight
    words = ["red shoes", "Blue Shirt", "lamp", "sofa bed", "xyzzy", "watch", "bag", "jeans", "红色 连衣裙", ""]
    searches, events = [], []
    for i in range(n_searches):
        text = rng.choice(words)
        empty = text == "xyzzy" or rng.random() < 0.03
        ids = () if empty else tuple(f"p{rng.randrange(200)}" for _ in range(10))
        ids = tuple(dict.fromkeys(ids))
        user = None if rng.random() < 0.1 else f"u{rng.randrange(300)}"
        s = SearchLog(query_id=f"q{i:06d}", ts=t0 + rng.random() * days * DAY, text=text or None,
                      norm=normalise_query(text), ids=ids, offset=0, total=0 if empty else 100 + i % 7,
                      user=user, session=f"s{i % 50}")
        searches.append(s)
        for k, pid in enumerate(ids):
            if rng.random() < 0.15 / (k + 1):
                events.append(EventRecord(f"e{i}-{k}-c", s.query_id, "click", pid, k, s.ts + 5, user))
                if rng.random() < 0.4:
                    events.append(EventRecord(f"e{i}-{k}-a", s.query_id, "add_to_cart", pid, k, s.ts + 9, user))
                    if rng.random() < 0.5:
                        events.append(EventRecord(f"e{i}-{k}-p", s.query_id, "purchase", pid, k, s.ts + 20, user))
            if rng.random() < 0.02:
                events.append(EventRecord(f"e{i}-{k}-v", s.query_id, "view", pid, k, s.ts + 1, user))
    return searches, events, t0


def fill(log, searches, events):
    for s in searches:
        log.log_search(s)
    for i in range(0, len(events), 1000):
        log.add_events(events[i:i + 1000])


def test_synthetic_log_figures_match_a_brute_force_count(tmp_path):
    from vitrine.feedback.eventlog import EventLog
    from vitrine.feedback import analytics

    searches, events, t0 = synthetic_log()
    log = EventLog(tmp_path / "events.sqlite")
    fill(log, searches, events)
    for since, until, gran, top in ((t0, t0 + 10 * DAY, "day", 20), (t0 + 1.5 * DAY, t0 + 3.2 * DAY, "hour", 3)):
        rep = analytics.report(log, since=since, until=until, granularity=gran, top=top).model_dump()
        exp = expected_report(searches, events, since, until, analytics.BUCKET_S[gran], top)
        assert comparable(rep) == exp
    rep = analytics.report(log, since=t0, until=t0 + 10 * DAY).model_dump()
    assert rep["totals"]["searches"] == len(searches) and len(rep["series"]) == 5
    assert rep["no_result_queries"][0]["query"] == "xyzzy"
    assert 0 < rep["totals"]["ctr"] < 1 and rep["totals"]["conversion"] < rep["totals"]["add_to_cart_rate"]
    log.close()


def test_postgres_and_sqlite_give_the_same_figures(tmp_path, pg_url):
    from vitrine.feedback.eventlog import EventLog
    from vitrine.feedback import analytics

    searches, events, t0 = synthetic_log(n_searches=1500, seed=3)
    lite, pg, pg2 = EventLog(tmp_path / "events.sqlite"), EventLog(pg_url), None
    try:
        fill(lite, searches[:750], events)  # events of searches not yet logged wait in the table
        fill(pg, searches[:750], [])
        pg2 = EventLog(pg_url)  # a second host writes the other half of the log into the same database
        fill(pg2, searches[750:], [])
        fill(lite, searches[750:], [])
        fill(pg2, [], events[: len(events) // 2])
        fill(pg, [], events[len(events) // 2:])
        for gran, since, until in (("day", t0, t0 + 6 * DAY), ("hour", t0 + DAY, t0 + 2 * DAY)):
            a = analytics.report(lite, since=since, until=until, granularity=gran).model_dump()
            b = analytics.report(pg, since=since, until=until, granularity=gran).model_dump()
            c = analytics.report(pg2, since=since, until=until, granularity=gran).model_dump()
            assert a == b == c
            assert comparable(a) == expected_report(searches, events, since, until, analytics.BUCKET_S[gran])
    finally:
        lite.close(), pg.close()
        if pg2 is not None:
            pg2.close()


# -- through the HTTP API and the CLI ---------------------------------------------------------------
own_engine, client = engine_and_client("analytics", engine_name="own_engine", api_key="s3cret")


def test_api_analytics_match_a_brute_force_count_of_the_logged_searches(client, own_engine):
    rng = random.Random(7)
    texts = ["blue shirt", "Blue  shirt!", "red dress", "watch", "casual shoes"]
    for i in range(40):
        res = client.post("/v1/search", json={"text": rng.choice(texts), "k": 10, "user": f"u{i % 6}",
                                              **({"filters": {"brand": ["NoSuchBrandAnywhere"]}} if i % 9 == 0
                                                 else {})})
        assert res.status_code == 200, res.text
        res = res.json()
        evs = []
        for pos, hit in enumerate(res["results"]):
            if rng.random() < 0.2:
                evs.append({"type": "click", "query_id": res["query_id"], "product_id": hit["id"], "position": pos})
                if rng.random() < 0.5:
                    evs.append({"type": rng.choice(["add_to_cart", "purchase"]), "query_id": res["query_id"],
                                "product_id": hit["id"], "position": pos})
        if evs:
            assert client.post("/v1/events", json={"events": evs}, headers=KEY).status_code == 202
    assert client.get("/v1/analytics").status_code == 401
    r = client.get("/v1/analytics", params={"top": 50}, headers=KEY)
    assert r.status_code == 200, r.text
    rep = r.json()
    raw = own_engine.feedback.log.read()
    exp = expected_report(raw.searches, raw.events, rep["since"], rep["until"], DAY, 50)
    assert comparable(rep) == exp
    assert rep["totals"]["searches"] == 40 and rep["totals"]["users"] == 6
    assert {q["query"] for q in rep["top_queries"]} >= {"blue shirt", "red dress"}  # normalised: one query
    assert rep["totals"]["clicks"] > 0 and rep["totals"]["mean_click_position"] >= 1
    assert rep["totals"]["no_results"] >= 1 and rep["no_result_queries"]
    # hourly buckets, a window, the forms of time
    r = client.get("/v1/analytics", params={"granularity": "hour", "since": "1h", "until": str(time.time() + 5)},
                   headers=KEY)
    assert r.status_code == 200 and sum(b["searches"] for b in r.json()["series"]) == 40
    assert client.get("/v1/analytics", params={"since": "tomorrow-ish"}, headers=KEY).status_code == 422
    assert client.get("/v1/analytics", params={"granularity": "week"}, headers=KEY).status_code == 422


def test_cli_analytics_json_is_the_api_report(client, own_engine):
    from click.testing import CliRunner

    from vitrine.cli.app import main

    until = time.time() + 5
    out = CliRunner().invoke(main, ["analytics", "--data", str(own_engine.data_dir), "--json", "--until", str(until)])
    assert out.exit_code == 0, out.output
    cli = json.loads(out.output)
    api = client.get("/v1/analytics", params={"until": str(until)}, headers=KEY).json()
    assert comparable(cli) == comparable(api)
    text = CliRunner().invoke(main, ["analytics", "--data", str(own_engine.data_dir)])
    assert text.exit_code == 0 and "searches by" in text.output and "top queries" in text.output
