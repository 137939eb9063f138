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


def test_analytics_and_events_run_in_side_processes_below_the_searches_priority(client, own_engine):
    """Issue 53 item 8: a flood of events and a dashboard polling analytics must not slow searches.
    Each runs in a spawned process of its own (vitrine/web/sideproc.py: its own interpreter lock),
    lowered to the side work's nice and the kernel's idle class; the batch is still stored before the
    202, and a read still sees every search logged before it."""
    import asyncio
    import os
    import sys

    from vitrine.web import sideproc

    jobs = client.app.state.feedback_jobs
    assert jobs.processes is not None  # side_work_process's default
    base = os.getpriority(os.PRIO_PROCESS, 0)
    res = search(client, text="watches", session="side-1")
    r = client.get("/v1/analytics", headers=KEY)  # sees the search logged just before it
    assert r.status_code == 200 and r.json()["totals"]["searches"] >= 1, r.text
    n = own_engine.feedback.log.counts()["events"]
    for i in range(2):
        ev = {"type": "click", "query_id": res["query_id"], "product_id": res["results"][i]["id"], "position": i}
        r = client.post("/v1/events", json={"events": [ev]}, headers=KEY)
        assert r.status_code == 202 and r.json() == {"accepted": 1, "new": 1}, r.text
    assert own_engine.feedback.log.counts()["events"] == n + 2  # stored before the 202
    bad = {"type": "click", "query_id": res["query_id"], "product_id": "not-on-the-page", "position": 0}
    r = client.post("/v1/events", json={"events": [bad]}, headers=KEY)  # refused in the process, named here
    assert r.status_code == 422 and "events[0].product_id" in r.text
    who = [asyncio.run(p.run(sideproc.identity)) for p in jobs.processes]
    pids = {pid for pid, _, _ in who}
    assert len(pids) == 2 and os.getpid() not in pids  # one process each, neither the API's
    assert asyncio.run(jobs.processes[0].run(sideproc.identity))[0] == who[0][0]  # reused, not one per job
    if sys.platform.startswith("linux"):
        assert {nice for _, nice, _ in who} == {min(19, base + 10)}  # side_work_nice's default
        assert {policy for _, _, policy in who} == {os.SCHED_IDLE}  # side_work_idle's default
        assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the API's own threads keep theirs


def test_a_side_process_that_died_is_replaced_and_its_request_answers_503(client, own_engine):
    """Killed (out of memory, by an operator): the job that was in it, or the next, answers 503 with
    Retry-After, nothing half-stored; the one after runs in a new process and is stored."""
    import asyncio
    import os
    import signal

    from vitrine.web import sideproc

    proc = client.app.state.feedback_jobs.processes[0]
    res = search(client, text="casual shoes", session="side-2")
    ev = {"type": "click", "query_id": res["query_id"], "product_id": res["results"][0]["id"], "position": 0,
          "event_id": "after-the-kill"}
    pid = asyncio.run(proc.run(sideproc.identity))[0]
    os.kill(pid, signal.SIGKILL)
    answers = []
    for _ in range(3):
        r = client.post("/v1/events", json={"events": [ev]}, headers=KEY)
        answers.append(r.status_code)
        if r.status_code == 202:
            break
        assert r.status_code == 503 and r.headers["Retry-After"] == "1", r.text
    assert answers[-1] == 202 and proc.restarts == 1, answers
    assert asyncio.run(proc.run(sideproc.identity))[0] != pid
    stored = [e for e in own_engine.feedback.log.read().events if e.event_id == "after-the-kill"]
    assert len(stored) == 1


def test_a_side_process_that_cannot_start_leaves_its_jobs_to_the_threads(client, own_engine, tmp_path, monkeypatch):
    """A script that serves the app without `if __name__ == "__main__":` is imported again by every
    spawned process, which then dies as it starts. A side process that never ran a job is started once
    more; when that one dies too, its jobs run on the API's threads: the events are stored and the
    report answers, not 503 after 503 (each of which would have run the script again)."""
    import asyncio
    import json
    import sys
    import types

    from vitrine.web import sideproc
    from vitrine.web.sidework import SideWork

    res = search(client, text="watches", session="side-4")
    ev = {"type": "click", "query_id": res["query_id"], "product_id": res["results"][0]["id"], "position": 0,
          "event_id": "from-an-unguarded-script"}
    script = tmp_path / "serve_unguarded.py"  # in a spawned process: what an unguarded `uvicorn.run(app)` comes to
    script.write_text("raise SystemExit('this script serves the app again')\n")
    fake_main = types.ModuleType("__main__")
    fake_main.__file__, fake_main.__spec__ = str(script), None
    monkeypatch.setitem(sys.modules, "__main__", fake_main)
    intake, side = SideWork(0, "test-intake"), SideWork(0, "test-side")
    jobs = sideproc.FeedbackJobs.open(own_engine, intake, side, own_engine.settings.web)
    try:
        assert jobs.processes is not None
        raw = json.dumps({"events": [ev]}).encode()
        assert asyncio.run(jobs.record_events(raw, None)) == (1, 1)
        assert jobs.processes[0].restarts == 2 and "__main__" in (jobs.processes[0].failed or "")
        assert asyncio.run(jobs.record_events(raw, None)) == (1, 0)  # on the thread at once; stored once
        assert jobs.processes[0].restarts == 2
        report = json.loads(asyncio.run(jobs.analytics_json(None, None, "day", 50)))
        assert jobs.processes[1].failed is not None
        watches = next(q for q in report["top_queries"] if q["query"] == "watches")
        assert watches["clicks"] >= 1
    finally:
        jobs.close()
        intake.close()
        side.close()
    stored = [e for e in own_engine.feedback.log.read().events if e.event_id == "from-an-unguarded-script"]
    assert len(stored) == 1


def test_an_events_body_is_validated_in_the_intake_process_with_the_fields_named(client, own_engine):
    """The body is parsed where it is stored (not on the API's event loop), and a body that does not
    fit the schema is a 422 listing each field as the API's own validation does."""
    res = search(client, text="watches", session="side-3")
    before = own_engine.feedback.log.counts()["events"]
    good = {"type": "click", "query_id": res["query_id"], "product_id": res["results"][0]["id"], "position": 0}
    r = client.post("/v1/events", json={"events": [good, {**good, "type": "teleport", "position": -1}]}, headers=KEY)
    assert r.status_code == 422, r.text
    locs = [d["loc"] for d in r.json()["error"]["detail"]]
    assert ["body", "events", 1, "type"] in locs and ["body", "events", 1, "position"] in locs
    assert "body.events.1.type" in r.json()["error"]["message"]
    for bad in (b"{not json", b"", b'{"events": []}', b'{"events": [], "extra": 1}'):
        r = client.post("/v1/events", content=bad, headers={**KEY, "Content-Type": "application/json"})
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_input", (bad, r.text)
    assert own_engine.feedback.log.counts()["events"] == before  # nothing of a refused batch is stored
