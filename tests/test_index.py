"""VectorIndex, FilterIndex and RecordStore against brute force."""

from __future__ import annotations

import numpy as np
import pytest

from vitrine.errors import InvalidInput, StorageError
from vitrine.index.filters import FilterIndex
from vitrine.index.records import RecordRow, RecordStore
from vitrine.index.vectors import VectorIndex


def _data(n=3000, d=32, seed=0):
    rng = np.random.default_rng(seed)
    # clustered-ish data with noise, normalised (inner product = cosine)
    centers = rng.normal(size=(20, d))
    x = centers[rng.integers(0, 20, n)] + 0.5 * rng.normal(size=(n, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x.astype(np.float32)


def brute(x, ids, q, k, allowed=None):
    mask = np.ones(len(ids), bool) if allowed is None else np.isin(ids, allowed)
    s = q @ x[mask].T
    order = np.argsort(-s, axis=1)[:, :k]
    return ids[mask][order]


# PQ16x4: 64-bit codes like PQ8, but 16 centroids per sub-quantizer, trained in a fraction of a second on
# 3,000 rows (PQ8's 256 want ~10,000 and took 7 s per test); the IVF-PQ code path is the same
FACTORIES = ["Flat", "SQfp16", "HNSW32", "IVF16,Flat", "IVF16,PQ16x4"]


@pytest.mark.parametrize("factory", FACTORIES)
def test_search_recall_against_brute_force(factory):
    x = _data()
    ids = np.arange(100, 100 + len(x), dtype=np.int64)
    idx = VectorIndex(32, factory, nprobe=16, ef_search=128)
    idx.upsert(ids, x)
    q = _data(50, seed=1)
    _, got = idx.search(q, 10)
    want = brute(x, ids, q, 10)
    recall = np.mean([len(set(g.tolist()) & set(w.tolist())) / 10 for g, w in zip(got, want)])
    assert recall >= (0.99 if factory in ("Flat", "SQfp16", "IVF16,Flat") else 0.5 if "PQ" in factory else 0.9)


def test_an_sqfp16_scan_scores_exactly_and_ranks_as_brute_force():
    """SQfp16 scans float16 codes, then scores its hits again from the float32 rows: the scores are
    the exact cosines, and the ranking is brute force's (on data without ties), with or without a
    filter, and with rows deleted."""
    x = _data(4000, 48, seed=5)
    ids = np.arange(7, 7 + len(x), dtype=np.int64)
    idx = VectorIndex(48, "SQfp16", exact_min=8, exact_fraction=0.0)
    idx.upsert(ids, x)
    q = _data(40, 48, seed=6)
    for allowed in (None, ids[::3]):
        s, got = idx.search(q, 20, allowed=allowed)
        np.testing.assert_array_equal(got, brute(x, ids, q, 20, allowed))
        exact = np.einsum("qkd,qd->qk", x[got - 7], q)
        np.testing.assert_allclose(s, exact, atol=1e-6)
    idx.delete(ids[:500])
    _, got = idx.search(q, 20)
    np.testing.assert_array_equal(got, brute(x[500:], ids[500:], q, 20))
    with pytest.raises(InvalidInput):
        VectorIndex(48, "SQ8")  # only the float16 scan is a flat factory here; SQ8 needs IVF


@pytest.mark.parametrize("factory", FACTORIES)
def test_selective_filters_are_exact(factory):
    x = _data()
    ids = np.arange(len(x), dtype=np.int64)
    idx = VectorIndex(32, factory, exact_min=64, exact_fraction=0.0)
    idx.upsert(ids, x)
    rng = np.random.default_rng(3)
    for size in (1, 3, 40):
        allowed = rng.choice(ids, size, replace=False)
        q = _data(5, seed=size)
        _, got = idx.search(q, 10, allowed=allowed)
        np.testing.assert_array_equal(got[:, : min(10, size)], brute(x, ids, q, min(10, size), allowed))
        assert (got[:, size:] == -1).all()


@pytest.mark.parametrize("factory", FACTORIES)
def test_filtered_ann_path_stays_inside_the_filter_and_never_comes_up_short(factory):
    x = _data()
    ids = np.arange(len(x), dtype=np.int64)
    idx = VectorIndex(32, factory, exact_min=0, exact_fraction=0.0)  # force the ANN path
    idx.upsert(ids, x)
    rng = np.random.default_rng(4)
    for size in (3, 40, 900):
        allowed = rng.choice(ids, size, replace=False)
        _, got = idx.search(_data(5, seed=size), 10, allowed=allowed)
        assert set(got[got >= 0].tolist()) <= set(allowed.tolist())
        assert ((got >= 0).sum(1) == min(10, size)).all()


def test_upsert_replaces_and_delete_removes():
    x = _data(500)
    idx = VectorIndex(32, "HNSW32")
    idx.upsert(np.arange(500), x)
    assert len(idx) == 500
    # replace id 7 with the vector of id 8: a query for it finds 7 and 8 at the top
    idx.upsert([7], x[8:9])
    _, got = idx.search(x[8:9], 2)
    assert set(got[0]) == {7, 8}
    assert idx.delete([8, 12345]) == 1
    _, got = idx.search(x[8:9], 3)
    assert 8 not in got[0] and got[0][0] == 7
    assert len(idx) == 499


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_flat_folds_rows_in_as_they_come_and_stays_exact(seed):
    """A CPU Flat index takes each write at once (no tail searched apart): after any mix of new
    rows, replaced rows and deletes, every search equals brute force over the live vectors."""
    rng = np.random.default_rng(seed)
    pool = _data(600, seed=seed + 10)
    idx = VectorIndex(32, "Flat", use_gpu="never", exact_min=8, exact_fraction=0.0)
    live: dict[int, np.ndarray] = {}
    for step in range(120):
        op = rng.random()
        if op < 0.6 or not live:
            ids = rng.choice(300, int(rng.integers(1, 6)), replace=False)  # new ids and replacements
            vecs = pool[rng.integers(0, len(pool), len(ids))]
            idx.upsert(ids, vecs)
            live.update({int(i): v for i, v in zip(ids, vecs)})
        elif op < 0.8:
            gone = rng.choice(sorted(live), min(len(live), int(rng.integers(1, 4))), replace=False)
            idx.delete(gone)
            for i in gone:
                live.pop(int(i))
        assert idx._indexed == idx._n  # folded: nothing waits in a tail
        if not live:
            continue
        ids = np.array(sorted(live), dtype=np.int64)
        x = np.stack([live[int(i)] for i in ids])
        q = pool[rng.integers(0, len(pool), 3)] + 0.01 * step
        k = int(rng.integers(1, 12))
        s, got = idx.search(q, k)
        kk = min(k, len(ids))
        want_s = -np.sort(-(q @ x.T), axis=1)[:, :kk]
        np.testing.assert_allclose(s[:, :kk], want_s, rtol=1e-5, atol=1e-5)
        assert set(got[:, :kk].ravel().tolist()) <= set(ids.tolist()) and (got[:, kk:] == -1).all()
        allowed = rng.choice(ids, max(1, len(ids) // 3), replace=False)
        s, got = idx.search(q, k, allowed=allowed)
        ka = min(k, len(allowed))
        xa = np.stack([live[int(i)] for i in allowed])
        np.testing.assert_allclose(s[:, :ka], -np.sort(-(q @ xa.T), axis=1)[:, :ka], rtol=1e-5, atol=1e-5)
        assert set(got[:, :ka].ravel().tolist()) <= set(allowed.tolist())


def test_compaction_keeps_everything_searchable():
    x = _data(4000)
    idx = VectorIndex(32, "HNSW32")
    idx.upsert(np.arange(4000), x)
    idx.delete(np.arange(0, 2000))  # triggers a rebuild
    assert idx.dead_rows == 0 and len(idx) == 2000
    _, got = idx.search(x[2500:2501], 1)
    assert got[0][0] == 2500


def test_ivf_untrained_is_searched_exactly():
    idx = VectorIndex(32, "IVF64,Flat")
    x = _data(100)
    idx.upsert(np.arange(100), x)  # too few to train 64 lists
    _, got = idx.search(x[:3], 1)
    assert got[:, 0].tolist() == [0, 1, 2]


def test_save_load_roundtrip_and_checksum(tmp_path):
    x = _data(1000)
    idx = VectorIndex(32, "IVF16,Flat")
    idx.upsert(np.arange(1000), x)
    idx.delete([3])
    sha = idx.save(tmp_path / "v.vidx")
    back = VectorIndex.load(tmp_path / "v.vidx", sha)
    q = _data(5, seed=9)
    np.testing.assert_array_equal(idx.search(q, 5)[1], back.search(q, 5)[1])
    assert 3 not in back and len(back) == 999
    with pytest.raises(StorageError, match="checksum"):
        VectorIndex.load(tmp_path / "v.vidx", "0" * 64)
    (tmp_path / "bad.vidx").write_bytes(b"garbage")
    with pytest.raises(StorageError):
        VectorIndex.load(tmp_path / "bad.vidx")
    assert not list(tmp_path.glob(".*.tmp"))  # no temp files left behind


def test_bad_input():
    with pytest.raises(InvalidInput, match="factory"):
        VectorIndex(8, "LSH")
    idx = VectorIndex(8)
    with pytest.raises(InvalidInput):
        idx.upsert([1], np.zeros((1, 7), np.float32))
    with pytest.raises(InvalidInput, match="NaN"):
        idx.upsert([1], np.full((1, 8), np.nan, np.float32))
    with pytest.raises(InvalidInput, match="duplicate"):
        idx.upsert([1, 1], np.zeros((2, 8), np.float32))
    s, i = idx.search(np.zeros(8, np.float32), 3)
    assert (i == -1).all()


def test_get_present_matches_lookups_one_by_one():
    rng = np.random.default_rng(3)
    idx = VectorIndex(8, "Flat")
    ids = rng.choice(1000, 60, replace=False)
    vecs = rng.standard_normal((60, 8)).astype(np.float32)
    idx.upsert(ids, vecs)
    idx.delete(ids[:10])
    asked = np.concatenate([ids, rng.integers(1000, 1100, 5), ids[:3]])
    have, got = idx.get_present(asked)
    assert have.tolist() == [int(i) in idx for i in asked]
    np.testing.assert_array_equal(got, idx.get(asked[have]))


@pytest.mark.parametrize("largest", [1_000, 50_000_000])  # dense ids, and ids sparse enough to turn the array off
def test_row_map_matches_a_dict_through_writes(largest):
    """RowMap's vectorised lookups equal a plain dict's through random sets and pops, with ids
    never seen, negative ones and a rebuild from rows."""
    from vitrine.index.rowmap import RowMap

    rng = np.random.default_rng(7)
    m, want = RowMap(), {}
    for step in range(3000):
        i = int(rng.integers(0, largest))
        if rng.random() < 0.3 and want:
            i = int(rng.choice(list(want)))
            assert m.pop(i) == want.pop(i)
        else:
            m.set(i, step)
            want[i] = step
        if step % 500 == 0:
            asked = np.concatenate([np.array(list(want), dtype=np.int64), rng.integers(-5, 2 * largest, 50)])
            assert m.rows(asked).tolist() == [want.get(int(a), -1) for a in asked]
            assert len(m) == len(want) and set(m) == set(want)
    assert m.pop(-3) is None and m.rows(np.zeros(0, np.int64)).tolist() == []
    ids = np.array([5, -1, 9, 2, -1], dtype=np.int64)
    r = RowMap.from_rows(ids)
    grown = RowMap()  # record-store iids: growing one by one past the array's always-dense length
    for i in range(70_000):
        grown.set(i, 2 * i)
    assert grown.rows(np.array([0, 69_999, 70_000, 35_123])).tolist() == [0, 139_998, -1, 70_246]
    assert r.rows(np.array([2, 5, 9, 7, -1])).tolist() == [3, 0, 2, -1, -1] and 9 in r and -1 not in r


def test_filter_index():
    f = FilterIndex(["category", "gender"])
    f.upsert(1, {"category": ["Apparel", "Topwear"], "gender": ["Men"]}, price=10)
    f.upsert(2, {"category": ["Footwear"], "gender": ["Women"]}, price=50)
    f.upsert(3, {"category": ["Apparel"], "gender": ["women"]})
    assert f.allowed({}) is None
    assert f.allowed({"category": ["apparel"]}).tolist() == [1, 3]
    assert f.allowed({"category": ["apparel"], "gender": ["WOMEN"]}).tolist() == [3]
    assert f.allowed({"gender": ["men", "women"]}).tolist() == [1, 2, 3]
    assert f.allowed({}, price_max=20).tolist() == [1]
    assert f.allowed({"category": ["nothing"]}).tolist() == []
    f.delete(3)
    assert f.allowed({"gender": ["women"]}).tolist() == [2]
    assert f.facet("gender") == {"Men": 1, "Women": 1}


def test_filter_index_cached_answers_follow_changes():
    """Repeated filters come from the cache; every upsert and delete drops it: after random
    changes each answer still equals a brute-force scan of what is stored."""
    rng = np.random.default_rng(0)
    cats, genders = ["Apparel", "Footwear", "Bags"], ["Men", "Women", "Unisex"]
    f = FilterIndex(["category", "gender"])
    truth: dict[int, tuple[str, str, float | None]] = {}
    queries = [({"category": ["apparel"]}, None), ({"gender": ["WOMEN", "unisex"]}, None),
               ({"category": ["bags"], "gender": ["men"]}, None), ({}, 30.0)]
    for _ in range(60):
        iid = int(rng.integers(0, 25))
        if rng.random() < 0.25:
            f.delete(iid)
            truth.pop(iid, None)
        else:
            c, g = cats[rng.integers(0, 3)], genders[rng.integers(0, 3)]
            price = None if rng.random() < 0.3 else float(rng.integers(1, 60))
            f.upsert(iid, {"category": [c], "gender": [g]}, price=price)
            truth[iid] = (c, g, price)
        for terms, pmax in queries:
            for _ in range(2):  # the second answer is the cached one
                got = f.allowed(terms, price_max=pmax)
                want = sorted(i for i, (c, g, p) in truth.items()
                              if all(v.casefold() in [x.casefold() for x in terms.get(k, [v])]
                                     for k, v in (("category", c), ("gender", g)))
                              and (pmax is None or (p is not None and p <= pmax)))
                assert got.tolist() == want
                assert not got.flags.writeable  # shared between searches: nobody may change it


def test_a_damaged_or_foreign_filter_file_is_refused(tmp_path):
    f = FilterIndex(["category", "brand"])
    f.upsert(3, {"category": ["Shoes"], "brand": ["Acme"]}, price=10.0)
    path = tmp_path / "filters.varr"
    sha = f.save(path)
    assert FilterIndex.load(path, sha, ["category", "brand"]).allowed({"brand": ["acme"]}).tolist() == [3]
    with pytest.raises(StorageError, match="holds fields"):
        FilterIndex.load(path, sha, ["category", "colour"])
    raw = bytearray(path.read_bytes())
    raw[10] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(StorageError, match="checksum"):
        FilterIndex.load(path, sha, ["category", "brand"])


def test_filter_index_columns_match_a_brute_force_reference(tmp_path):
    """Multi-valued fields that widen as products with more values arrive, ids far apart, prices,
    exclusions, facet counts, counts over result ids and price edges, after random upserts and
    deletes, and across saves and loads (as a snapshot keeps it): every answer equals a scan of
    plain Python dicts."""
    from collections import Counter

    rng = np.random.default_rng(1)
    paths = [["Apparel"], ["Apparel", "Topwear"], ["Apparel", "Topwear", "Shirts"], ["Home", "Kitchen"],
             ["Home", "Kitchen", "Knives", "Chef Knives", "Japanese"]]
    brands = ["Acme", "Zorbex", "acme", "Quux"]
    f = FilterIndex(["category", "brand"])
    truth: dict[int, tuple[list[str], list[str], float | None]] = {}
    for step in range(300):
        iid = int(rng.choice([rng.integers(0, 40), rng.integers(5000, 5010)]))
        if rng.random() < 0.2:
            f.delete(iid)
            truth.pop(iid, None)
        else:
            cat = paths[rng.integers(0, len(paths))]
            brand = [] if rng.random() < 0.2 else [brands[rng.integers(0, len(brands))]]
            price = None if rng.random() < 0.3 else float(rng.integers(1, 500))
            f.upsert(iid, {"category": cat, "brand": brand}, price=price)
            truth[iid] = (cat, brand, price)
        if step % 100 == 55:  # saved and loaded: the loaded index answers, and takes changes, the same
            sha = f.save(tmp_path / f"filters-{step}.varr")
            f = FilterIndex.load(tmp_path / f"filters-{step}.varr", sha, ["category", "brand"])
        if step % 10:
            continue
        low = {i: ({c.casefold() for c in cat}, {b.casefold() for b in br}, p) for i, (cat, br, p) in truth.items()}
        assert len(f) == len(truth)
        for terms, pmin, excl in [({"category": ["topwear"]}, None, None), ({"brand": ["ACME", "quux"]}, 100.0, None),
                                  ({"category": ["home"]}, None, {"brand": ["zorbex"]}), ({}, None, {"category": ["apparel"]}),
                                  ({"category": ["japanese"], "brand": ["acme"]}, None, None), ({"brand": ["nobody"]}, None, None)]:
            got = f.allowed(terms, price_min=pmin, exclude=excl)
            want = sorted(i for i, (cs, bs, p) in low.items()
                          if all({v.casefold() for v in vals} & (cs if k == "category" else bs) for k, vals in terms.items())
                          and (pmin is None or (p is not None and p >= pmin))
                          and not any({v.casefold() for v in vals} & (cs if k == "category" else bs)
                                      for k, vals in (excl or {}).items()))
            assert got is not None and got.tolist() == want, (terms, pmin, excl)
        # facets count each product once per value; values show as first written
        assert sum(f.facet("category").values()) == sum(len({c.casefold() for c in cat}) for cat, _, _ in truth.values())
        assert Counter({k.casefold(): v for k, v in f.facet("brand").items()}) == \
            Counter(b.casefold() for _, br, _ in truth.values() for b in br)
        some = list(truth)[::2] + [99_999]  # an id never written counts nothing
        assert Counter({k.casefold(): v for k, v in f.counts(some, "category").items()}) == \
            Counter(c for i in some if i in low for c in low[i][0])
        prices = f.prices(some)
        assert [None if np.isnan(x) else x for x in prices.tolist()] == [truth[i][2] if i in truth else None for i in some]
        priced = [p for _, _, p in truth.values() if p is not None]
        assert f.has_prices() == bool(priced)
        assert f.price_edges() == sorted(set(f.price_edges()))


def test_record_store_sequence_and_tombstones(tmp_path):
    rs = RecordStore(tmp_path / "r.sqlite")
    v = {"fused": np.ones(4, np.float32), "image": None, "text": np.zeros(4, np.float32)}
    seq1, iids = rs.upsert_many([RecordRow("a", {"title": "A"}, "h1", vectors=v),
                                 RecordRow("b", {"title": "B"}, "h2", vectors=v)])
    assert seq1 == 1 and len(set(iids)) == 2
    seq2, again = rs.upsert_many([RecordRow("a", {"title": "A2"}, "h3", vectors=v)])
    assert seq2 == 2 and again == iids[:1]  # same iid on update
    seq3, deleted = rs.delete_many(["b", "zzz"])
    assert seq3 == 3 and deleted == [iids[1]]
    # a delete that writes nothing claims no sequence number: the store's current one could be
    # another process's change, and an engine taking it for its own would never replay it
    assert rs.delete_many(["b", "zzz"]) == (0, []) and rs.seq == 3
    changed = list(rs.iter_rows(since_seq=1, include_deleted=True))
    assert {(r.id, r.deleted) for r in changed} == {("a", False), ("b", True)}
    assert rs.get("a").doc["title"] == "A2" and rs.get("b") is None
    np.testing.assert_array_equal(rs.get("a", with_vectors=True).vectors["fused"], np.ones(4))
    rs.close()
    assert RecordStore(tmp_path / "r.sqlite").count() == 1


def test_recent_seq_sees_its_own_writes_at_once_and_another_process_within_its_age(tmp_path):
    v = {"fused": np.ones(4, np.float32), "image": None, "text": None}
    mine, other = RecordStore(tmp_path / "r.sqlite"), RecordStore(tmp_path / "r.sqlite")
    assert mine.recent_seq() == 0
    seq1, _ = mine.upsert_many([RecordRow("a", {"title": "A"}, "h1", vectors=v)])
    assert mine.recent_seq() == seq1  # read-your-writes without asking SQLite
    seq2, _ = other.upsert_many([RecordRow("b", {"title": "B"}, "h2", vectors=v)])
    assert mine.recent_seq(max_age_s=60) == seq1  # another handle's write: not asked for yet
    assert mine.recent_seq(max_age_s=0) == seq2 == mine.recent_seq(max_age_s=60)
    seq3, _ = mine.delete_many(["a"])
    assert mine.recent_seq(max_age_s=60) == seq3
    mine.close(), other.close()


def test_index_benchmark_reads_the_vectors_of_the_newest_snapshot(engine):
    """`vitrine bench index` grows its 1M set from a data dir's saved vectors: it must find them
    in the versioned snapshot layout the engine writes (it once read the pre-versioned paths)."""
    from vitrine_bench.index import catalogue_vectors

    live = engine.vectors["fused"]
    vecs = catalogue_vectors(engine.settings.storage.data_dir)
    assert vecs.shape == (len(live), live.dim)
    ref = live.get(live.ids())
    # the same vectors, whatever their row order: each live vector has an identical row
    assert np.allclose((ref @ vecs.T).max(axis=1), 1.0, atol=1e-5)


def test_search_threads_apply_in_every_searching_thread():
    """OpenMP's thread count is per thread: a search in a thread started after
    set_search_threads (an API request thread) runs with that count too, and the same results."""
    import threading

    import faiss

    from vitrine.index import vectors

    x = _data(500, 16)
    ids = np.arange(500, dtype=np.int64)
    idx = VectorIndex(16, "Flat")
    idx.upsert(ids, x)
    before = vectors._search_threads
    got: dict[str, object] = {}
    try:
        vectors.set_search_threads(1)

        def search() -> None:
            got["default"] = faiss.omp_get_max_threads()  # OpenMP's per-thread default, before any search
            got["ids"] = idx.search(x[:3], 5)[1]
            got["after"] = faiss.omp_get_max_threads()

        t = threading.Thread(target=search)
        t.start()
        t.join()
    finally:
        vectors._search_threads = before
    assert got["after"] == 1
    np.testing.assert_array_equal(got["ids"], brute(x, ids, x[:3], 5))
