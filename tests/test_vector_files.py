"""Vector index files: mapped read-only and shared, written rows kept beside them, old format read."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from vitrine.errors import StorageError
from vitrine.index import vector_files, vectors
from vitrine.index.vectors import VectorIndex


def _data(n: int, d: int = 32, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).normal(size=(n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _brute(x: np.ndarray, ids: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
    return ids[np.argsort(-(q @ x.T), axis=1, kind="stable")[:, :k]]


def _mapped_files() -> set[str]:
    return {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines() if len(line.split()) >= 6}


@pytest.mark.parametrize("factory", ["SQfp16", "Flat", "IVF8,Flat", "HNSW16"])
def test_a_loaded_index_maps_its_file_and_answers_as_the_saved_one(tmp_path, factory):
    x, ids = _data(2000), np.arange(10, 2010, dtype=np.int64)
    idx = VectorIndex(32, factory)
    idx.upsert(ids, x)
    sha = idx.save(tmp_path / "v.vidx")
    back = VectorIndex.load(tmp_path / "v.vidx", sha)
    assert back.mapped_rows == 2000
    assert str(tmp_path / "v.vidx") in _mapped_files()
    q = _data(20, seed=1)
    np.testing.assert_array_equal(idx.search(q, 10)[1], back.search(q, 10)[1])
    np.testing.assert_array_equal(back.get([10, 2009]), x[[0, 1999]])
    private = VectorIndex.load(tmp_path / "v.vidx", sha, mmap=False)
    assert private.mapped_rows == 0
    np.testing.assert_array_equal(private.search(q, 10)[1], back.search(q, 10)[1])


def test_rows_written_after_a_mapped_load_are_searched_beside_it_then_saved(tmp_path, monkeypatch):
    x, ids = _data(3000), np.arange(3000, dtype=np.int64)
    idx = VectorIndex(32, "SQfp16")
    idx.upsert(ids[:2000], x[:2000])
    sha = idx.save(tmp_path / "a.vidx")
    back = VectorIndex.load(tmp_path / "a.vidx", sha)
    back.upsert(ids[2000:2500], x[2000:2500])  # new rows: the in-memory tail
    back.upsert(ids[:100], x[2500:2600])  # replaced rows: tombstoned in the mapped part
    back.delete(ids[100:150])
    live_ids = np.concatenate([ids[:100], ids[150:2500]])
    live_x = np.concatenate([x[2500:2600], x[150:2500]])
    q = _data(30, seed=2)
    assert back.mapped_rows == 2000 and back._indexed == 2000  # the mapped index took nothing in
    np.testing.assert_array_equal(back.search(q, 10)[1], _brute(live_x, live_ids, q, 10))
    allowed = live_ids[::7]
    got = back.search(q, 5, allowed=allowed)[1]
    np.testing.assert_array_equal(got, _brute(live_x[::7], allowed, q, 5))
    # past the tail's limit the index is copied into memory and takes the tail in
    monkeypatch.setattr(vectors, "MAPPED_TAIL_MAX", 100)
    back.upsert(ids[2500:2600], x[2600:2700])
    assert back._indexed == back._n
    live_ids = np.concatenate([live_ids, ids[2500:2600]])
    live_x = np.concatenate([live_x, x[2600:2700]])
    np.testing.assert_array_equal(back.search(q, 10)[1], _brute(live_x, live_ids, q, 10))
    sha2 = back.save(tmp_path / "b.vidx")
    again = VectorIndex.load(tmp_path / "b.vidx", sha2)
    assert len(again) == len(live_ids) and again._indexed == again._n
    np.testing.assert_array_equal(again.search(q, 10)[1], _brute(live_x, live_ids, q, 10))


def test_saving_a_mapped_index_with_a_tail_writes_every_row_into_the_file(tmp_path):
    x = _data(1500)
    idx = VectorIndex(32, "SQfp16")
    idx.upsert(np.arange(1000), x[:1000])
    back = VectorIndex.load(tmp_path / "a.vidx", idx.save(tmp_path / "a.vidx"))
    back.upsert(np.arange(1000, 1500), x[1000:])
    again = VectorIndex.load(tmp_path / "b.vidx", back.save(tmp_path / "b.vidx"))
    assert back._indexed == 1000  # the live index stayed mapped; the saved one has every row
    assert again._indexed == again._n == 1500
    q = _data(10, seed=3)
    np.testing.assert_array_equal(again.search(q, 10)[1], _brute(x, np.arange(1500), q, 10))


def test_damaged_and_truncated_files_are_refused(tmp_path):
    idx = VectorIndex(32, "SQfp16")
    idx.upsert(np.arange(500), _data(500))
    sha = idx.save(tmp_path / "v.vidx")
    raw = (tmp_path / "v.vidx").read_bytes()
    (tmp_path / "short.vidx").write_bytes(raw[: len(raw) // 2] + raw[-16:])
    with pytest.raises(StorageError, match="unreadable"):
        VectorIndex.load(tmp_path / "short.vidx")
    with pytest.raises(StorageError, match="checksum"):
        VectorIndex.load(tmp_path / "short.vidx", sha)
    (tmp_path / "tiny.vidx").write_bytes(b"x")
    with pytest.raises(StorageError, match="unreadable"):
        VectorIndex.load(tmp_path / "tiny.vidx")


def test_array_files_and_checking_several_files_at_once(tmp_path):
    arrays = {"a": np.arange(5, dtype=np.int32), "b": np.ones((2, 3), dtype=np.float64)}
    sha = vector_files.write_arrays(tmp_path / "x.varr", {"k": [1, "two"]}, arrays)
    meta, back = vector_files.read_arrays(tmp_path / "x.varr", sha)
    assert meta == {"k": [1, "two"]} and all(np.array_equal(back[k], v) and back[k].dtype == v.dtype
                                             for k, v in arrays.items())
    back["a"][0] = 9  # read into memory: writable, the file unchanged
    assert vector_files.read_arrays(tmp_path / "x.varr", sha)[1]["a"][0] == 0
    idx = VectorIndex(4, "Flat")
    idx.upsert([1, 2], np.eye(4, dtype=np.float32)[:2])
    vsha = idx.save(tmp_path / "v.vidx")
    with pytest.raises(StorageError, match="not an array file"):
        vector_files.read_arrays(tmp_path / "v.vidx", vsha)
    files = [(tmp_path / "x.varr", sha), (tmp_path / "v.vidx", vsha)]
    vector_files.verify_many(files, "index file")  # both intact: no error
    raw = bytearray((tmp_path / "v.vidx").read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    (tmp_path / "v.vidx").write_bytes(bytes(raw))
    with pytest.raises(StorageError, match=r"v\.vidx failed its checksum"):
        vector_files.verify_many(files, "index file")


def test_format_1_files_are_still_read(tmp_path):
    """An index saved before format 2 (an .npz with the FAISS blob) loads, into memory."""
    import faiss

    x = _data(300)
    flat = faiss.index_factory(32, "Flat", faiss.METRIC_INNER_PRODUCT)
    flat.add(x)
    meta = {"format": 1, "dim": 32, "factory": "Flat", "n": 300, "indexed": 300, "nprobe": 16, "ef_search": 128}
    buf = io.BytesIO()
    np.savez(buf, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), vectors=x,
             ids=np.arange(300, dtype=np.int64), faiss=faiss.serialize_index(flat))
    (tmp_path / "old.vidx").write_bytes(buf.getvalue())
    old = VectorIndex.load(tmp_path / "old.vidx")
    assert old.mapped_rows == 0 and len(old) == 300
    q = _data(5, seed=4)
    np.testing.assert_array_equal(old.search(q, 3)[1], _brute(x, np.arange(300), q, 3))
    assert vector_files.FORMAT_VERSION == 2


def _clustered(n: int, d: int = 32, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(64, d))[rng.integers(0, 64, n)] + 0.4 * rng.normal(size=(n, d))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def test_auto_chooses_the_index_by_size_at_each_save(tmp_path, monkeypatch):
    from vitrine.index import index_choice

    monkeypatch.setattr(index_choice, "ANN_FROM", 5000)
    monkeypatch.setattr(index_choice, "BACK_BELOW", 4000)
    assert index_choice.choose(4999) == "SQfp16" and index_choice.choose(30_000) == "IVF512,Flat"
    assert index_choice.choose(4500, "IVF512,Flat") == "IVF256,Flat"  # hysteresis: stays IVF above 4,000
    assert index_choice.choose(10**6) == "IVF4096,Flat"
    x, ids = _clustered(30_000), np.arange(30_000, dtype=np.int64)
    idx = VectorIndex(32, "auto")
    idx.upsert(ids[:4000], x[:4000])
    idx.save(tmp_path / "a.vidx")
    assert idx.factory == "SQfp16"
    idx.upsert(ids[4000:], x[4000:])
    assert idx.factory == "SQfp16"  # rows come in as they are; the choice waits for the snapshot
    sha = idx.save(tmp_path / "b.vidx")
    assert idx.factory == "IVF512,Flat" and idx._index is not None and idx._indexed == 30_000
    assert idx.nprobe >= 16  # raised from the setting until its own rows reach the recall target
    rows_q = x[::97]
    got_rows = idx.search(rows_q, 11)[1]
    exact_rows = _brute(x, ids, rows_q, 11)
    own = np.mean([len(set(g) & set(w)) / 11 for g, w in zip(got_rows.tolist(), exact_rows.tolist())])
    assert own >= 0.97 or idx.nprobe == 512, (own, idx.nprobe)
    back = VectorIndex.load(tmp_path / "b.vidx", sha, auto=True, nprobe=16)
    assert back.factory == "IVF512,Flat" and back.auto and back.nprobe == idx.nprobe  # the calibrated lists kept
    q = _clustered(50, seed=5)
    got = back.search(q, 10)[1]
    want = _brute(x, ids, q, 10)
    assert np.mean([len(set(g) & set(w)) / 10 for g, w in zip(got.tolist(), want.tolist())]) >= 0.9
    back.delete(ids[3000:])  # shrinks below the line: a scan again at the next snapshot
    back.save(tmp_path / "c.vidx")
    assert back.factory == "SQfp16"
    np.testing.assert_array_equal(back.search(q, 10)[1], _brute(x[:3000], ids[:3000], q, 10))
    fixed = VectorIndex(32, "SQfp16")
    fixed.upsert(ids, x)
    fixed.save(tmp_path / "d.vidx")
    assert fixed.factory == "SQfp16"  # a configured factory is kept whatever the size


def test_a_switch_built_while_rows_were_written_waits_for_the_next_save(tmp_path, monkeypatch):
    """The new index is built outside the lock; a write meanwhile keeps the old one (nothing lost)."""
    from vitrine.index import index_choice

    monkeypatch.setattr(index_choice, "ANN_FROM", 5000)
    x, ids = _clustered(21_000), np.arange(21_000, dtype=np.int64)
    idx = VectorIndex(32, "auto")
    idx.upsert(ids[:20_000], x[:20_000])
    real = VectorIndex._extend_index
    written = []

    def meanwhile(self: VectorIndex) -> None:
        real(self)
        if self is not idx and not written:  # the new index being built: a write lands on the live one
            written.append(True)
            idx.upsert(ids[20_000:], x[20_000:])

    monkeypatch.setattr(VectorIndex, "_extend_index", meanwhile)
    sha = idx.save(tmp_path / "a.vidx")
    assert written and idx.factory == "SQfp16" and len(idx) == 21_000  # not switched, the write kept
    monkeypatch.setattr(VectorIndex, "_extend_index", real)
    assert len(VectorIndex.load(tmp_path / "a.vidx", sha)) == 21_000
    idx.save(tmp_path / "b.vidx")
    assert idx.factory.startswith("IVF") and len(idx) == 21_000
    q = _clustered(20, seed=7)
    got, want = idx.search(q, 10)[1], _brute(x, ids, q, 10)
    assert np.mean([len(set(g) & set(w)) / 10 for g, w in zip(got.tolist(), want.tolist())]) >= 0.9


def test_a_failed_switch_leaves_the_index_as_it_was_and_the_snapshot_is_written(tmp_path, monkeypatch):
    from vitrine.index import index_choice

    monkeypatch.setattr(index_choice, "ANN_FROM", 5000)

    def broken(*a: object, **kw: object) -> int:
        raise RuntimeError("k-means ran out of something")

    monkeypatch.setattr(index_choice, "calibrate_nprobe", broken)
    x, ids = _clustered(21_000), np.arange(21_000, dtype=np.int64)
    idx = VectorIndex(32, "auto")
    idx.upsert(ids, x)
    sha = idx.save(tmp_path / "a.vidx")
    assert idx.factory == "SQfp16" and len(VectorIndex.load(tmp_path / "a.vidx", sha)) == 21_000
    q = _clustered(5, seed=8)
    np.testing.assert_array_equal(idx.search(q, 10)[1], _brute(x, ids, q, 10))
