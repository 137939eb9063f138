"""The API's side work on its own threads (``side_work_process`` off; vitrine/web/sidework.py):
analytics on the side-work thread, events on the intake thread, both below the searches' priority.
The default runs them in processes of their own (tests/test_trust_analytics.py)."""

from __future__ import annotations


from conftest import engine_and_client

KEY = {"X-API-Key": "s3cret"}

own_engine, client = engine_and_client("side-threads", engine_name="own_engine", api_key="s3cret",
                                       side_work_process=False)


def search(client, **body):
    r = client.post("/v1/search", json={"k": 5, **body})
    assert r.status_code == 200, r.text
    return r.json()


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


def test_an_events_body_is_validated_on_the_intake_thread_with_the_fields_named(client, own_engine):
    res = search(client, text="watches")
    good = {"type": "click", "query_id": res["query_id"], "product_id": res["results"][0]["id"], "position": 0}
    r = client.post("/v1/events", json={"events": [{**good, "type": "teleport"}]}, headers=KEY)
    assert r.status_code == 422 and ["body", "events", 0, "type"] in [d["loc"] for d in r.json()["error"]["detail"]]
    r = client.post("/v1/events", json={"events": [good]}, headers=KEY)
    assert r.status_code == 202 and r.json() == {"accepted": 1, "new": 1}, r.text
