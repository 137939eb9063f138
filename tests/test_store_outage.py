"""The shared PostgreSQL store crashes (``pg_ctl -m immediate``) under a replica: product reads
come from the local mirror of the documents without waiting on the database, writes are refused
at once, nothing acknowledged is lost, and writes are accepted again by themselves once the
database is back (the pool does not wait out its reconnection back-off). On a real PostgreSQL.
The API's side (searches answer 200 with ``degraded: ["store"]``) is in test_postgres_replicas."""

from __future__ import annotations

import time

import numpy as np
import pytest

from vitrine.errors import StorageError


def _rows(n: int, start: int = 0):
    from vitrine.index.records import RecordRow

    words = ["red leather shoe", "blue cotton shirt", "black running shoe", "green silk scarf"]
    return [RecordRow(id=f"p{i}", doc={"title": f"{words[i % 4]} {i}", "price": float(i)}, content_hash=f"h{i}",
                      version=1, model_key="m", vectors={"fused": np.full(4, i, np.float32), "image": None,
                                                          "text": np.full(4, i, np.float32)})
            for i in range(start, start + n)]


def _until(cond, timeout: float, every: float = 0.05) -> float:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "timed out"
        time.sleep(every)
    return time.monotonic() - t0


def test_a_crashed_store_serves_reads_from_the_mirror_refuses_writes_and_comes_back(pg_server, pg_url,
                                                                                     tmp_path):
    from vitrine.index.failover import FailoverRecordStore
    from vitrine.index.store import open_stores

    import psycopg

    # the test server commits asynchronously (fast tests); a store's commits here are acknowledged
    # only once durable, as in production, or a crash could lose them whatever Vitrine does
    with psycopg.connect(pg_url, autocommit=True) as c:
        c.execute(f'ALTER DATABASE "{pg_url.rsplit("/", 1)[1]}" SET synchronous_commit TO on')
    pool_timeout = 10.0  # far above what a refusal without waiting takes, even on a loaded machine
    store, _photos = open_stores(pg_url, tmp_path, timeout_s=pool_timeout, mirror=True)  # as a replica opens it
    assert isinstance(store, FailoverRecordStore)
    try:
        store.upsert_many(_rows(30))
        _until(lambda: store.mirror.seq >= store.seq, 10)
        ids = [f"p{i}" for i in range(30)]
        live = store.get_many(ids)
        iids = {r.iid: r.id for r in live.values()}
        assert not store.degraded and store.stale_s == 0.0

        pg_server.stop("immediate")
        try:
            _until(lambda: store.degraded, 5)  # the watcher sees it without any request waiting
            t0 = time.monotonic()
            got = store.get_many(ids)
            by_iid = store.get_by_iids(list(iids))
            one = store.get("p7")
            with pytest.raises(StorageError, match="unavailable"):
                store.upsert_many(_rows(1, start=100))
            with pytest.raises(StorageError):
                store.bm25_scores("shirt")
            took = time.monotonic() - t0
            assert took < pool_timeout, f"reads and a refused write took {took:.1f} s: they waited on the pool"
            assert {k: r.doc for k, r in got.items()} == {k: r.doc for k, r in live.items()}
            assert {i: r.id for i, r in by_iid.items()} == iids and one is not None and one.doc["price"] == 7.0
            assert store.count() == 30 and store.ids() == sorted(ids, key=lambda p: live[p].iid)
            assert store.recent_seq() == store.mirror.seq  # the last change seen, not an error
            time.sleep(0.3)
            assert store.stale_s > 0
        finally:
            pg_server.start()
        # writes resume by themselves, whatever the pool's back-off (how fast: bench-results/store_outage.md)
        _until(lambda: not store.degraded, 30)
        store.upsert_many(_rows(1, start=100))
        assert store.get("p100") is not None and store.count() == 31  # nothing acknowledged was lost
        _until(lambda: store.mirror.get("p100") is not None, 30)
    finally:
        store.close()
