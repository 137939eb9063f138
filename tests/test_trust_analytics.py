"""Analytics that count what shoppers did (issue 53, items 1 and 2), through the HTTP API over a copy of
the small real subset: a page or a re-sort of a search is not a new search (its events count with it),
and the clients the bot filter catches are counted and shown."""

from __future__ import annotations

from conftest import engine_and_client

KEY = {"X-API-Key": "s3cret"}
EV = "ev-key"


own_engine, client = engine_and_client("trust-analytics", engine_name="own_engine", api_key="s3cret", events_key=EV)


def search(client, **body):
    r = client.post("/v1/search", json={"k": 5, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_a_page_or_a_re_sort_is_not_a_new_search_and_bots_are_counted(client, own_engine):
    first = search(client, text="casual shoes", session="an-1")
    page2 = search(client, text="casual shoes", session="an-1", offset=5)
    resort = search(client, text="casual shoes", session="an-1", sort="newest")
    other = search(client, text="watches", session="an-1")
    anon = search(client, text="casual shoes", user="someone-else")  # another shopper: a search of its own
    assert all(r["results"] for r in (first, page2, resort, other, anon))
    hit = page2["results"][1]
    honest = {"X-API-Key": EV, "User-Agent": "honest-browser"}
    click = {"type": "click", "query_id": page2["query_id"], "product_id": hit["id"], "position": 6}
    assert client.post("/v1/events", json={"events": [click]}, headers=honest).status_code == 202
    # one client posts 70 events in a minute: more than bot_events_per_minute (60)
    bot = {"X-API-Key": EV, "User-Agent": "bot-9000"}
    h0 = other["results"][0]
    flood = [{"type": "click", "query_id": other["query_id"], "product_id": h0["id"], "position": 0,
              "event_id": f"bot-{i}"} for i in range(70)]
    assert client.post("/v1/events", json={"events": flood}, headers=bot).status_code == 202

    r = client.get("/v1/analytics", params={"top": 50}, headers=KEY)
    assert r.status_code == 200, r.text
    rep = r.json()
    raw = own_engine.feedback.log.read()
    assert len(raw.searches) == 5  # five pages logged ...
    t = rep["totals"]
    assert t["pages"] == 5 and t["searches"] == 3  # ... three searches: casual shoes (3 pages), watches, the other's
    shoes = next(q for q in rep["top_queries"] if q["query"] == "casual shoes")
    assert shoes["searches"] == 2 and shoes["pages"] == 4
    assert shoes["clicked"] == 1 and shoes["clicks"] == 1 and shoes["mean_click_position"] == 7.0
    assert shoes["ctr"] == 0.5  # the click on page 2 counts with its search, once
    assert rep["bots"] == {"per_minute": 60, "clients": 1, "events": 70}
    # the CLI says the same
    from click.testing import CliRunner
    from vitrine.cli.app import main

    out = CliRunner().invoke(main, ["analytics", "--data", str(own_engine.data_dir)])
    assert out.exit_code == 0, out.output
    assert "3 searches by" in out.output and "(5 pages)" in out.output
    assert "bot filter: 1 clients, 70 events" in out.output


def test_analytics_run_on_the_side_work_thread_below_the_searches_priority(client, monkeypatch):
    """Issue 53 item 8: a dashboard polling analytics must not take the CPU from searches. The report
    is computed on the API's side-work thread, whose nice value is above the request threads' (Linux:
    per thread), so the kernel serves searches first."""
    import os
    import sys
    import threading

    from vitrine.feedback import analytics
    from vitrine.web.sidework import lower_this_thread

    seen: list[tuple[str, int]] = []
    policies: set[int] = set()
    real = analytics.report

    def spy(*a, **kw):
        tid = threading.get_native_id()
        seen.append((threading.current_thread().name, os.getpriority(os.PRIO_PROCESS, tid)))
        if sys.platform.startswith("linux"):
            policies.add(os.sched_getscheduler(tid))
        return real(*a, **kw)

    monkeypatch.setattr(analytics, "report", spy)
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert search(client, text="watches", session="side-1")["results"]
    for _ in range(2):
        r = client.get("/v1/analytics", headers=KEY)
        assert r.status_code == 200, r.text
        assert r.json()["totals"]["searches"] >= 1
    assert len(seen) == 2 and {name for name, _ in seen} == {"vitrine-side-work_0"}  # one thread, reused
    if sys.platform.startswith("linux"):
        assert {nice for _, nice in seen} == {min(19, base + 10)}  # side_work_nice's default
        assert policies == {os.SCHED_IDLE}  # side_work_idle's default: only the CPU searches leave
        assert os.sched_getscheduler(threading.get_native_id()) == os.SCHED_OTHER
        # lowering is per thread: the caller's own priority is untouched
        got: list[int] = []
        t = threading.Thread(target=lambda: (lower_this_thread(3), got.append(
            os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))))
        t.start()
        t.join()
        assert got == [min(19, base + 3)] and os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base


def test_events_are_stored_on_the_intake_thread_below_the_searches_priority(client, monkeypatch):
    """Issue 53 item 8: a flood of events takes only the CPU searches leave. Each batch is stored on
    the API's intake thread (its own: a batch never queues behind an analytics scan), at the side
    work's priority; the batch is stored before the 202 (nothing acknowledged is lost)."""
    import os
    import sys
    import threading

    from vitrine.search.engine import Engine

    seen: list[tuple[str, int | None]] = []
    real = Engine.record_events

    def spy(self, events, client=None):
        tid = threading.get_native_id()
        seen.append((threading.current_thread().name,
                     os.sched_getscheduler(tid) if sys.platform.startswith("linux") else None))
        return real(self, events, client=client)

    monkeypatch.setattr(Engine, "record_events", spy)
    res = search(client, text="watches")
    for i in range(2):
        ev = {"type": "click", "query_id": res["query_id"], "product_id": res["results"][i]["id"], "position": i}
        r = client.post("/v1/events", json={"events": [ev]}, headers=KEY)
        assert r.status_code == 202 and r.json()["accepted"] == 1, r.text
    assert [name for name, _ in seen] == ["vitrine-intake_0"] * 2
    if sys.platform.startswith("linux"):
        assert {policy for _, policy in seen} == {os.SCHED_IDLE}
