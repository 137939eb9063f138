"""The in-memory BM25 gives FTS5's own bm25() numbers, and follows writes."""

from __future__ import annotations

import heapq
import json

import numpy as np
import pytest

from vitrine.errors import StorageError
from vitrine.index import symbolic
from vitrine.index.bm25 import MemoryBM25
from vitrine.ingest.catalog import ingest_file
from vitrine.search.writes import ProductInput
from vitrine.search.models import Product


def _queries(rows) -> list[str]:
    qs = [r["productDisplayName"] for r in rows[:60]]
    qs += ["men black casual shoes", "women red dress", "blue jeans", "watch", "Nike", "café crème",
           "ÉLÉGANT kurta", "the and of", "2012 summer", "shoes shoe shoeing", "puma vs adidas"]
    return qs


def _same(engine, mem: MemoryBM25, queries: list[str]) -> int:
    """Compares every query; returns how many the memory scorer answered itself."""
    answered = 0
    for q in queries:
        with engine.records._lock:
            ref = symbolic.scores(engine.records._conn, q)
        got = mem.scores(q, engine.records.seq)
        if got is None:  # only SQLite can answer this one exactly
            continue
        answered += 1
        assert set(got) == set(ref), q
        for k, v in ref.items():
            assert got[k] == v, (q, k, got[k], v)  # bitwise: same formula, same order
        if hasattr(got, "top") and ref:
            want = heapq.nlargest(20, ref.items(), key=lambda t: (t[1], -t[0]))
            assert got.top(20) == want, q
            allowed = np.asarray(sorted(ref)[::2], dtype=np.int64)
            aset = set(allowed.tolist())
            want = heapq.nlargest(7, ((i, s) for i, s in ref.items() if i in aset), key=lambda t: (t[1], -t[0]))
            assert got.top(7, allowed) == want, q
    return answered


def test_memory_bm25_equals_fts5_and_follows_writes(fresh_engine, catalog_dir, subset_rows, tmp_path):
    eng = fresh_engine
    ingest_file(eng, catalog_dir / "catalog.jsonl", progress=False)
    mem = MemoryBM25(eng.records.path)
    mem.typo_tolerance = False  # FTS5 has none: compare like with like (typos: tests/test_storefront.py)
    qs = _queries(subset_rows)
    assert _same(eng, mem, qs) >= len(qs) - 2

    # writes after the snapshot: a renamed product, a new one, a delete
    first = json.loads((catalog_dir / "catalog.jsonl").read_text().splitlines()[0])
    renamed = Product.model_validate({**{k: v for k, v in first.items() if k != "image"},
                                      "title": "Zanzibar turquoise sandals", "brand": "Zed"})
    new = Product(id="new-1", title="Turquoise zanzibar kurta for women", brand="Zed", category=["Apparel"])
    eng.upsert([ProductInput(renamed), ProductInput(new)])
    eng.delete([subset_rows[5]["id"]])
    assert _same(eng, mem, [*qs, "zanzibar turquoise", "zed"]) >= len(qs)
    hits = mem.scores("zanzibar", eng.records.seq)
    assert hits is not None and len(hits) == 2

    # saved with its changes merged in, loaded by another: the same numbers, and it follows later
    # writes from the loaded postings (a deleted, a renamed and a new product)
    sha, note = mem.save(tmp_path / "bm25.varr")
    assert note["seq"] == eng.records.seq and note["products"] == eng.records.count()
    loaded = MemoryBM25(eng.records.path)
    loaded.typo_tolerance = False
    loaded.load(tmp_path / "bm25.varr", sha)
    assert loaded.built and _same(eng, loaded, [*qs, "zanzibar turquoise", "zed"]) >= len(qs)
    eng.delete(["new-1"])
    eng.upsert([ProductInput(Product(id="new-2", title="Quokka zanzibar mug", category=["Home"]))])
    assert _same(eng, loaded, [*qs, "zanzibar turquoise", "zed", "quokka mug", "kurta"]) >= len(qs)
    assert _same(eng, mem, ["zanzibar turquoise", "quokka mug"]) == 2
    mem.close()
    loaded.close()
    broken = MemoryBM25(eng.records.path)
    raw = bytearray((tmp_path / "bm25.varr").read_bytes())
    raw[100] ^= 0xFF
    (tmp_path / "bm25.varr").write_bytes(bytes(raw))
    with pytest.raises(StorageError, match="checksum"):
        broken.load(tmp_path / "bm25.varr", sha)
    assert not broken.built
    broken.close()


def test_record_store_serves_bm25_from_memory(engine, subset_rows):
    q = subset_rows[0]["productDisplayName"]
    got = engine.records.bm25_scores(q)
    with engine.records._lock:
        ref = symbolic.scores(engine.records._conn, q)
    assert hasattr(got, "top") and dict(got.items()) == ref
    # a word FTS5 splits in two is left to SQLite: same answer either way
    assert dict(engine.records.bm25_scores("t_shirt men").items()) == symbolic.scores(engine.records._conn, "t_shirt men")
