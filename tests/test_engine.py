"""Engine: search by words, photo or both; filters; explanations; writes; recovery."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vitrine.errors import InvalidInput, NotFound
from vitrine.index.vectors import VectorIndex
from vitrine.ingest.catalog import ingest_file
from vitrine.search.engine import Engine
from vitrine.search.writes import ProductInput
from vitrine.search.models import Filters, Product, SearchRequest

from conftest import SOURCE


def photo(pid: str) -> bytes:
    return (SOURCE / "images" / f"{pid}.jpg").read_bytes()


def test_photo_finds_its_own_product(engine, subset_rows):
    for r in subset_rows[::6]:
        res = engine.search(SearchRequest(k=3), image=photo(r["id"]))
        top = res.results[0]
        same_photo = photo(top.id) == photo(r["id"])
        assert top.id == r["id"] or same_photo


def test_text_search_finds_the_right_kind_of_product(engine):
    # the fashion-configured ranking (aligner + fusion weights); an untuned catalogue's text ranking
    # is the floor (the text tower's own cosine), tested in test_tuning.py
    engine.settings.search.calibration = "off"
    try:
        for query, want in [("wrist watch", {"Watches"}), ("women handbag", {"Handbags"}),
                            ("sneakers", {"Casual Shoes", "Sports Shoes"}), ("men shirt", {"Shirts"})]:
            res = engine.search(SearchRequest(text=query, k=5))
            kinds = [h.category[-1] for h in res.results]
            assert sum(k in want for k in kinds) >= 3, (query, kinds)
    finally:
        engine.settings.search.calibration = "auto"


@pytest.mark.parametrize("flt", [
    {"gender": "Women"}, {"colour": "Black"}, {"category": "Footwear"},
    {"category": ["Watches", "Sunglasses"], "gender": "Men"},
])
def test_every_hit_matches_the_filters(engine, flt):
    res = engine.search(SearchRequest(text="stylish", k=20, filters=Filters.model_validate(flt)))
    assert res.results
    for h in res.results:
        if "gender" in flt:
            assert h.attributes["gender"].casefold() == flt["gender"].casefold()
        if "colour" in flt:
            assert h.attributes["colour"].casefold() == flt["colour"].casefold()
        if "category" in flt:
            cats = flt["category"] if isinstance(flt["category"], list) else [flt["category"]]
            assert set(cats) & set(h.category)


def test_selective_filter_returns_all_matches(engine, subset_rows):
    # a filter matching very few products must still return exactly those
    counts: dict[tuple[str, str], list[str]] = {}
    for r in subset_rows:
        counts.setdefault((r["articleType"], r["baseColour"]), []).append(r["id"])
    (atype, colour), ids = next((k, v) for k, v in counts.items() if 2 <= len(v) <= 4)
    res = engine.search(SearchRequest(text="anything", k=10, filters=Filters(category=atype, colour=colour)))
    assert sorted(h.id for h in res.results) == sorted(ids)


def test_text_and_photo_together_with_explanation(engine, subset_rows):
    r = subset_rows[10]
    res = engine.search(SearchRequest(text=r["productDisplayName"], k=5, explain=True), image=photo(r["id"]))
    assert res.results[0].id == r["id"]
    ex = res.results[0].explanation
    assert ex is not None and ex.modalities == ["image", "text"]
    assert {"image->image", "text->fused"} <= set(ex.signals)  # + the fusion signals' contributions
    scores = [h.score for h in res.results]
    assert scores == sorted(scores, reverse=True)


def test_bad_queries(engine):
    with pytest.raises(InvalidInput, match="empty query"):
        engine.search(SearchRequest(text="   "))
    with pytest.raises(InvalidInput, match="k must be"):
        engine.search(SearchRequest(text="shoe", k=10_000))
    with pytest.raises(InvalidInput, match="base64"):
        engine.search(SearchRequest(image_b64="***"))
    with pytest.raises(NotFound):
        engine.get("no-such-id")


def test_long_text_is_truncated_not_refused(engine):
    res = engine.search(SearchRequest(text="red shirt " * 500, k=3))
    assert 1 <= len(res.results) <= 3  # the query's slots (red, shirts) filter: the subset has fewer than 3


def test_upsert_replace_delete_and_versions(settings_factory, mlp_encoder, subset_rows, tmp_path):
    from vitrine.search.engine import Engine

    fresh_engine = Engine(settings_factory(tmp_path / "data", adapter="mlp"), mlp_encoder)  # photo self-match = 1.0
    r = subset_rows[0]
    p = Product(id="p1", title=r["productDisplayName"], category=["Apparel"], attributes={"gender": "Men"},
                price=100, version=2)
    rep = fresh_engine.upsert([ProductInput(p, image=photo(r["id"]))])
    assert rep.upserted == 1
    assert fresh_engine.search(SearchRequest(k=1), image=photo(r["id"])).results[0].id == "p1"
    # a stale version is ignored; a newer one replaces the record and the vector
    old = p.model_copy(update={"title": "stale", "version": 1})
    assert fresh_engine.upsert([ProductInput(old)]).stale == 1
    other = subset_rows[50]
    newer = p.model_copy(update={"title": other["productDisplayName"], "version": 3})
    assert fresh_engine.upsert([ProductInput(newer, image=photo(other["id"]))]).upserted == 1
    assert fresh_engine.get("p1").title == other["productDisplayName"]
    assert fresh_engine.search(SearchRequest(k=1), image=photo(other["id"])).results[0].score > 0.99
    assert fresh_engine.search(SearchRequest(k=1, filters=Filters(price_max=50)), image=photo(r["id"])).results == []
    assert fresh_engine.delete(["p1"]) == 1 and fresh_engine.delete(["p1"]) == 0
    assert fresh_engine.search(SearchRequest(text="anything")).results == []
    with pytest.raises(NotFound):
        fresh_engine.get("p1")


def test_reopen_recovers_snapshot_and_replays_changes(settings_factory, encoder, catalog_dir, tmp_path):
    s = settings_factory(tmp_path / "d")
    e1 = Engine(s, encoder)
    ingest_file(e1, catalog_dir / "catalog.jsonl", progress=False, limit=40)  # saves a snapshot
    ids = e1.records.ids()
    # changes after the snapshot, then "crash" (no save)
    e1.delete(ids[:5])
    q = SearchRequest(text="blue shirt", k=10)
    before = [h.id for h in e1.search(q).results]
    e1.records.close()
    manifest = json.loads((tmp_path / "d" / "index" / "manifest.json").read_text())
    assert manifest["count"] == 40
    e2 = Engine(s, encoder)
    assert len(e2) == 35 and [h.id for h in e2.search(q).results] == before
    # a corrupt snapshot is refused and rebuilt from the records
    e2.close()
    (tmp_path / "d" / "index" / "fused.vidx").write_bytes(b"corrupt")
    e3 = Engine(s, encoder)
    assert len(e3) == 35 and [h.id for h in e3.search(q).results] == before
    e3.close()


def test_a_snapshot_of_a_factory_auto_would_choose_serves_auto_and_is_mapped(settings_factory, encoder, catalog_dir,
                                                                              tmp_path):
    """A data dir that ran SQfp16 keeps its snapshot when index_factory becomes auto (the default),
    loads it mapped, and another fixed factory still rebuilds."""
    e1 = Engine(settings_factory(tmp_path / "d", index_factory="SQfp16"), encoder)
    ingest_file(e1, catalog_dir / "catalog.jsonl", progress=False, limit=30)  # saves a snapshot
    e1.close()
    e2 = Engine(settings_factory(tmp_path / "d", index_factory="auto"), encoder)
    rec = e2.index.recovery
    assert rec["snapshot"] is not None and not rec["rebuilt"] and not rec["skipped"], rec
    fused = e2.vectors["fused"]
    assert isinstance(fused, VectorIndex) and fused.auto and fused.factory == "SQfp16" and fused.mapped_rows == 30
    e2.close()
    e3 = Engine(settings_factory(tmp_path / "d", index_factory="Flat"), encoder)
    assert e3.index.recovery["rebuilt"] and e3.index.recovery["skipped"]
    e3.close()


def test_vectors_are_normalised(engine):
    ids = engine.records.ids()[:10]
    v = np.stack([engine.vector_of(i) for i in ids])
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-4)
