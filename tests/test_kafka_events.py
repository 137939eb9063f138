"""Shopper events from Kafka (docs/kafka.md, "Shopper events"): `vitrine publish-events` ->
`vitrine consume --events` worker -> the feedback log, against a real broker (Tansu): stored once
(by event_id, or a key made from the content), invalid ones to the dead-letter topic with the
reason naming the field, offsets committed after the events are durable, a replay stores nothing."""

from __future__ import annotations

import json

import pytest

from conftest import copy_data_dir
from kafka_broker import kafka_settings, unique
from vitrine.ingest import events as ev
from vitrine.ingest.events import BadEvent, ShopperEvent, parse_event
from vitrine.search.models import SearchRequest


def test_shopper_event_schema():
    e = {"type": "click", "query_id": "q1", "product_id": "p", "position": 2}
    assert isinstance(parse_event(None, json.dumps(e).encode()), ShopperEvent)  # a bare event
    got = parse_event(b"any-key", json.dumps({"op": "event", "event": e}).encode())
    assert isinstance(got, ShopperEvent) and got.event.position == 2  # the key is free
    key, value = ev.encode_event(ev.shopper_event(e))
    assert key == b"q1" and parse_event(key, value).event == got.event
    for bad, field in [({**e, "position": -1}, "event.position"), ({**e, "type": "like"}, "event.type"),
                       ({**e, "colour": "red"}, "event.colour")]:
        with pytest.raises(BadEvent) as err:
            parse_event(None, json.dumps({"op": "event", "event": bad}).encode())
        assert err.value.kind == "schema" and field in err.value.reason


@pytest.fixture()
def events_engine(engine, settings_factory, encoder, stream, tmp_path):
    from vitrine.search.engine import Engine

    dst = tmp_path / "data"
    copy_data_dir(engine.data_dir, dst)
    s = kafka_settings(settings_factory, dst, {**stream, "kafka_topic": unique("events")})
    eng = Engine(s, encoder)
    yield eng
    eng.close()


def test_events_from_kafka_stored_once_bad_ones_dead_lettered(events_engine, tmp_path):
    from click.testing import CliRunner

    from vitrine.cli.app import main
    from vitrine.ingest.kafka.publisher import Publisher, publish_events
    from vitrine.ingest.kafka.status import group_lag, iter_dead_letters
    from vitrine.ingest.kafka.worker import IngestWorker

    eng = events_engine
    s = eng.settings
    pages = [eng.search(SearchRequest(text=t, k=10), log_search=True) for t in ("blue shirt", "shoes", "watch")]
    good = []
    for n, res in enumerate(pages):
        for pos, hit in enumerate(res.results[:6]):
            e = {"type": ["view", "click", "add_to_cart"][pos % 3], "query_id": res.query_id, "product_id": hit.id,
                 "position": pos, "user": f"u{n}"}
            if pos % 2:
                e["event_id"] = f"k-{n}-{pos}"
            good.append(e)
    not_shown = next(r.id for r in pages[1].results if r.id not in {h.id for h in pages[0].results})
    bad = [({"type": "click", "query_id": "0" * 27, "product_id": "x", "position": 0}, "query_id"),
           ({"type": "click", "query_id": pages[0].query_id, "product_id": not_shown, "position": 1}, "product_id"),
           ({"type": "click", "query_id": pages[0].query_id, "product_id": "x", "position": -1}, "event.position"),
           ({"type": "like", "query_id": pages[0].query_id, "product_id": "x", "position": 0}, "event.type")]
    f = tmp_path / "events.jsonl"
    lines = [json.dumps(e) for e in good]
    lines.insert(3, json.dumps({"events": good[:2]}))  # a POST body too: both events again (same content)
    lines.insert(5, "{not json")
    f.write_text("\n".join(lines) + "\n")
    rep = publish_events(s, f)
    assert rep.sent == len(good) + 2 and [x.line for x in rep.failed] == [6]
    with Publisher(s) as pub:  # invalid ones as a producer might send them, and one event sent twice
        for e, _ in bad:
            pub.send_raw(b"k", json.dumps({"op": "event", "event": e}).encode())
        pub.send(ev.shopper_event(good[1]))
    st = IngestWorker(eng, s).run(until_idle=1.0, timeout=120)
    assert st["applied"] == {"events_stored": len(good), "events_duplicate": 3}, st
    assert st["dlq"] == len(bad) and st["dlq_by_kind"] == {"schema": len(bad)} and st["lag"] == 0
    assert eng.feedback.log.counts()["events"] == len(good)
    assert sum(p["committed"] or 0 for p in group_lag(s).values()) == len(good) + 2 + len(bad) + 1
    reasons = [d["reason"] for d in iter_dead_letters(s, IngestWorker(eng, s).dlq_topic, expect=len(bad))]
    assert len(reasons) == len(bad)
    for _, field in bad:
        assert any(field in r for r in reasons), (field, reasons)
    stored = {e.event_id: e for e in eng.feedback.log.read().events}
    assert stored["k-0-1"].position == 1 and stored["k-0-1"].type == "click"

    # at least once: a new group re-reads the whole topic and stores nothing twice
    st2 = IngestWorker(eng, s.updated(kafka_group=unique("replay"))).run(until_idle=1.0, timeout=120)
    assert st2["applied"] == {"events_stored": 0, "events_duplicate": len(good) + 3}
    assert eng.feedback.log.counts()["events"] == len(good)

    # the command line: publish-events counts a bad line; consume --events takes its own defaults
    res = CliRunner().invoke(main, ["publish-events", str(f), "--topic", s.ingest.kafka_topic, "--bootstrap",
                                    s.ingest.kafka_bootstrap])
    assert res.exit_code == 0 and f"published {len(good) + 2} events" in res.output and "line 6" in res.output
    res = CliRunner().invoke(main, ["consume", "--help"])
    assert "--events" in res.output
