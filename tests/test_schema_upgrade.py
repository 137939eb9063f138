"""A data dir made by the previous release opens: its event log, rules and sessions, rebuilt from
that release's own DDL (tests/data/previous-release/, copied from commit 838e4e5), are upgraded
to the current schema versions by the current code, every row survives, and the columns added
since (the event log's client, sort and filters) work. A store from a newer Vitrine is refused
with a message saying what to do; PostgreSQL upgrades the same way."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import sqlite3
import time
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa


OLD = Path(__file__).parent / "data" / "previous-release"
USER_KEY = "5f1d3a0c9b8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a392817060504"


def _old_data_dir(tmp_path: Path) -> Path:
    """A data dir's job stores as the previous release left them."""
    d = tmp_path / "old-data"
    d.mkdir()
    for script, file in (("events.sql", "events.sqlite"), ("rules.sql", "records.sqlite"),
                         ("sessions.sql", "sessions.sqlite")):
        with contextlib.closing(sqlite3.connect(d / file)) as c:
            c.executescript((OLD / script).read_text(encoding="utf-8"))
            c.commit()
    return d


def _columns(path: Path, table: str) -> list[str]:
    with contextlib.closing(sqlite3.connect(path)) as c:
        return [r[1] for r in c.execute(f"PRAGMA table_info({table})")]


def _versions(path: Path) -> dict[str, int]:
    with contextlib.closing(sqlite3.connect(path)) as c:
        return dict(c.execute("SELECT store, version FROM vitrine_schema"))


def _search(qid: str, **kw):
    from vitrine.feedback.types import SearchLog

    base = dict(query_id=qid, ts=time.time(), text="Black Shoes", norm="black shoes", ids=("p1", "p4"), offset=0,
                total=2, image=False, user=None, session="s-new", experiment=None, variant=None)
    return SearchLog(**{**base, **kw})


def test_the_previous_release_event_log_opens_upgraded(tmp_path):
    from vitrine.feedback import tables
    from vitrine.feedback.eventlog import open_event_log
    from vitrine.feedback.types import EventRecord

    d = _old_data_dir(tmp_path)
    assert "client" not in _columns(d / "events.sqlite", "searches")  # the fixture is the old schema
    log = open_event_log(None, d)
    try:
        assert _versions(d / "events.sqlite")["feedback"] == tables.VERSION == 3
        # version 3: covering indexes replace the single-column ones (analytics read indexes only)
        with contextlib.closing(sqlite3.connect(d / "events.sqlite")) as c:
            idx = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'events' "
                                           "AND sql IS NOT NULL")}
        assert idx == {"events_ts_client", "events_query_type"}
        assert {"client", "sort", "filters"} <= set(_columns(d / "events.sqlite", "searches"))
        assert "client" in _columns(d / "events.sqlite", "events")
        # every old row, as it was; the new columns read as absent
        old = log.searches(["q-old-1", "q-old-2"])
        assert old["q-old-1"].ids == ("p1", "p2", "p3") and old["q-old-1"].text == "Red Shoes"
        assert old["q-old-1"].experiment == "exp1" and old["q-old-1"].variant == "A"
        assert old["q-old-1"].client is None and old["q-old-1"].sort is None and old["q-old-1"].filters is None
        assert old["q-old-2"].total == 0 and old["q-old-2"].ts == 1796500060.5
        sl = log.read()
        assert [e.event_id for e in sl.events] == ["e-old-1", "e-old-2", "e-old-3"]
        assert [e.type for e in sl.events] == ["click", "add_to_cart", "purchase"]
        assert all(e.client is None and e.position == 1 for e in sl.events)
        assert log.counts() == {"searches": 2, "events": 3}
        # the old user key still hashes users (same shopper, same hash after the upgrade)
        want = hmac.new(bytes.fromhex(USER_KEY), b"shopper-1", hashlib.sha256).hexdigest()[:24]
        assert log.hash_user("shopper-1") == want
        # the old experiment survives; analytics read the old rows
        assert [(n, json.loads(s)["split"]) for n, s, _ in log.experiment_specs()] == [("exp1", [50, 50])]
        agg = log.aggregate(0.0, 1796600000.0, 86400.0, 10)
        totals = dict(zip(("searches", "users", "no_results", "clicked", "carted", "bought"), agg["totals"][0]))
        assert totals == {"searches": 2, "users": 1, "no_results": 1, "clicked": 1, "carted": 1, "bought": 1}
        # the new columns work
        log.log_search(_search("q-new", client="c-1", sort="price_asc", filters='{"brand":["Acme"]}'))
        assert log.add_events([EventRecord(event_id="e-new", query_id="q-new", type="click", product_id="p4",
                                           position=1, ts=time.time(), user=None, session="s-new",
                                           client="c-1")]) == 1
        new = log.searches(["q-new"])["q-new"]
        assert (new.client, new.sort, new.filters) == ("c-1", "price_asc", '{"brand":["Acme"]}')
        assert [e.client for e in log.read().events if e.event_id == "e-new"] == ["c-1"]
    finally:
        log.close()
    # opened again: already at the current version, nothing to do, nothing lost
    log = open_event_log(None, d)
    try:
        assert log.counts() == {"searches": 3, "events": 4}
    finally:
        log.close()


def test_the_previous_release_rules_and_sessions_open(tmp_path):
    from vitrine.conversation.store import open_session_store
    from vitrine.merchandising.store import open_rule_store

    d = _old_data_dir(tmp_path)
    rules = open_rule_store(None, d)
    try:
        assert rules.version() == 3 and rules.count() == 2
        got = {r.id: r for r in rules.all()}
        assert set(got) == {"boost-red", "pin-blue"}
        assert got["boost-red"].enabled and got["boost-red"].body["when"] == {"query": "red"}
        assert not got["pin-blue"].enabled and got["pin-blue"].seq == 2
        assert [(r.id, r.deleted) for r in rules.changed_since(2)] == [("old-sale", True)]
        assert rules.put("boost-blue", {"when": {"query": "blue"}}, True).seq == 4  # change numbers go on
    finally:
        rules.close()
    sessions = open_session_store("auto", data_dir=d, database_url=None, ttl_s=3600, max_sessions=10)
    try:
        s = sessions.get("s-old")
        assert s is not None and not s.expired and s.state["slots"] == {"colour": ["Black"]}
        assert np.array_equal(np.frombuffer(s.vector or b"", dtype=np.float32), np.array([1.0, 2.0], np.float32))
        assert s.version == 0  # the column the upgrade added: old rows start at 0, and compare-and-swap works
        assert sessions.put("s-old", {"turn": 2}, None, expected=0) and not sessions.put("s-old", {}, None, expected=0)
        assert sessions.get("s-old").version == 1
    finally:
        sessions.close()
    assert _versions(d / "records.sqlite") == {"rules": 1}
    assert _versions(d / "sessions.sqlite") == {"sessions": 2}


def test_a_store_from_a_newer_vitrine_is_refused_with_what_to_do(tmp_path):
    from vitrine.errors import StorageError
    from vitrine.feedback.eventlog import open_event_log

    d = _old_data_dir(tmp_path)
    open_event_log(None, d).close()
    with contextlib.closing(sqlite3.connect(d / "events.sqlite")) as c:
        c.execute("UPDATE vitrine_schema SET version = 7 WHERE store = 'feedback'")
        c.commit()
    with pytest.raises(StorageError) as e:
        open_event_log(None, d)
    msg = str(e.value)
    assert "newer Vitrine" in msg and "version 7" in msg and "knows up to 3" in msg and "upgrade Vitrine" in msg


def test_a_failed_upgrade_changes_nothing_and_says_why(tmp_path):
    from vitrine.errors import StorageError
    from vitrine.feedback.eventlog import open_event_log

    d = _old_data_dir(tmp_path)
    with contextlib.closing(sqlite3.connect(d / "events.sqlite")) as c:
        # a searches table the upgrade cannot alter: a view of the old rows (ALTER TABLE refuses views)
        c.executescript("ALTER TABLE searches RENAME TO searches_old; CREATE VIEW searches AS SELECT * FROM searches_old;")
    with pytest.raises(StorageError) as e:
        open_event_log(None, d)
    msg = str(e.value)
    assert "cannot upgrade" in msg and "from schema version 1 to 2" in msg and "client, sort and filters" in msg
    with contextlib.closing(sqlite3.connect(d / "events.sqlite")) as c:  # rolled back: still the old schema
        assert not c.execute("SELECT 1 FROM sqlite_master WHERE name='vitrine_schema'").fetchall()
        assert "client" not in [r[1] for r in c.execute("PRAGMA table_info(events)")]


def test_the_previous_release_postgres_event_log_opens_upgraded(pg_url):
    from vitrine.feedback.eventlog import open_event_log

    eng = sa.create_engine(sa.engine.make_url(pg_url).set(drivername="postgresql+psycopg"))
    try:
        with eng.begin() as c:
            c.exec_driver_sql((OLD / "pg-events.sql").read_text(encoding="utf-8"))
        log = open_event_log(pg_url, "/nonexistent")
        try:
            assert log.counts() == {"searches": 2, "events": 3}
            assert log.searches(["q-old-1"])["q-old-1"].ids == ("p1", "p2", "p3")
            want = hmac.new(bytes.fromhex(USER_KEY), b"shopper-1", hashlib.sha256).hexdigest()[:24]
            assert log.hash_user("shopper-1") == want
            log.log_search(_search("q-new", client="c-1", sort="price_asc", filters="{}"))
            new = log.searches(["q-new"])["q-new"]
            assert (new.client, new.sort, new.filters) == ("c-1", "price_asc", "{}")
            log.save_experiment("e", "{}", 1.0)  # the experiment tables come with version 2
            assert [n for n, _, _ in log.experiment_specs()] == ["e"]
        finally:
            log.close()
        with eng.connect() as c:
            assert dict(c.exec_driver_sql("SELECT store, version FROM vitrine_schema").all()) == {"feedback": 3}
            assert {r[0] for r in c.exec_driver_sql("SELECT indexname FROM pg_indexes WHERE tablename = "
                                                    "'vitrine_events' AND indexname <> 'vitrine_events_pkey'")} \
                == {"vitrine_events_ts_client", "vitrine_events_query_type"}
    finally:
        eng.dispose()
