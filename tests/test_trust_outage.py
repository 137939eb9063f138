"""A store outage never lies (on a real PostgreSQL, crashed with ``pg_ctl -m immediate``): a product
acknowledged after the replica's mirror last copied is a 503 (``StorageError``), never "not
found"; a deleted one is not found; a mirror that has not finished its first copy serves nothing;
every row the mirror serves says so (``from_mirror``), and the API maps the refusal to 503 with
``Retry-After``."""

from __future__ import annotations

import time

import numpy as np
import pytest

from vitrine.errors import StorageError


def _rows(n: int, start: int = 0):
    from vitrine.index.records import RecordRow

    return [RecordRow(id=f"p{i}", doc={"title": f"red shoe {i}", "price": float(i)}, content_hash=f"h{i}",
                      version=1, model_key="m", vectors={"fused": np.full(4, i, np.float32), "image": None,
                                                          "text": np.full(4, i, np.float32)})
            for i in range(start, start + n)]


def _until(cond, timeout: float) -> None:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "timed out"
        time.sleep(0.05)


def test_an_acknowledged_product_is_never_not_found_while_the_store_is_down(pg_server, pg_url, tmp_path):
    from vitrine.index.failover import FailoverRecordStore
    from vitrine.index.mirror import DocMirror
    from vitrine.index.store import open_stores

    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as c:
        c.execute(f'ALTER DATABASE "{pg_url.rsplit("/", 1)[1]}" SET synchronous_commit TO on')
    store, _photos = open_stores(pg_url, tmp_path, timeout_s=10.0, mirror=True)
    assert isinstance(store, FailoverRecordStore)
    try:
        store.upsert_many(_rows(10))
        store.delete_many(["p3"])
        _until(lambda: store.mirror.ready and store.mirror.seq >= store.seq, 10)
        store.follower.close()  # the mirror stops copying: what follows is acknowledged after its last copy
        store.upsert_many(_rows(1, start=50))  # acknowledged by the store
        assert store.get("p50") is not None and not store.get("p50").from_mirror
        assert store.mirror.get("p50") is None  # the mirror never saw it

        pg_server.stop("immediate")
        try:
            _until(lambda: store.degraded, 5)
            one = store.get("p7")
            assert one is not None and one.doc["price"] == 7.0 and one.from_mirror  # served, and says so
            assert all(r.from_mirror for r in store.get_by_iids([one.iid]).values())
            with pytest.raises(StorageError, match="cannot be said"):
                store.get("p50")  # acknowledged before the crash: a 503, not "not found"
            assert store.get("p3") is None  # deleted before the crash, and the mirror knows it
            assert store.get("p3", include_deleted=True).deleted
            # a mirror that never finished its first copy serves nothing, rather than "not found"
            fresh = DocMirror(tmp_path / "fresh" / "m.sqlite")
            assert not fresh.ready
            store.mirror, kept = fresh, store.mirror
            try:
                with pytest.raises(StorageError, match="first copy"):
                    store.get("p7")
                with pytest.raises(StorageError, match="first copy"):
                    store.get_many(["p7"])
            finally:
                store.mirror = kept
                fresh.close()
        finally:
            pg_server.start()
        _until(lambda: not store.degraded, 30)
        got = store.get("p50")
        assert got is not None and not got.from_mirror
    finally:
        store.close()


def test_a_store_refusal_is_503_with_retry_after(engine, settings_factory, encoder, tmp_path):
    """Through the HTTP API: a StorageError from the store answers 503 with ``Retry-After``."""
    from conftest import engine_copy
    from fastapi.testclient import TestClient

    from vitrine.web.app import create_app

    eng = engine_copy(engine, settings_factory, encoder, tmp_path / "data")
    pid = eng.index.records.ids()[0]
    try:
        with TestClient(create_app(engine=eng)) as client:
            ok = client.get(f"/v1/products/{pid}")
            assert ok.status_code == 200 and "degraded" not in ok.json() and "X-Vitrine-Degraded" not in ok.headers
            real_get = eng.index.records.get

            def down(*a, **kw):
                raise StorageError("the record store is unavailable (test: a read refused)")

            eng.index.records.get = down
            try:
                r = client.get(f"/v1/products/{pid}")
            finally:
                eng.index.records.get = real_get
            assert r.status_code == 503 and r.headers["Retry-After"] == "1"
            assert r.json()["error"]["code"] == "unavailable"
    finally:
        eng.close()
