"""Indexes opened once and served by processes forked after (``vitrine serve --workers N``,
vitrine/web/workers.py): an engine given them serves what an engine opening the data dir itself
serves, caught up with the changes made after them, and refuses indexes of another store.

(The fork itself, and that each worker says it serves the shared indexes, is test_workers's: it
runs the command. Here the engines share one process, so what the adopting engine changes, the
one that loaded them sees too; nothing below uses the first engine after handing them over.)"""

from __future__ import annotations

import time

from vitrine.search.models import Filters, Product, SearchRequest
from vitrine.search.writes import ProductInput

from conftest import SUBSET_SIZE, engine_copy


def _product(pid: str, title: str) -> ProductInput:
    return ProductInput(Product(id=pid, title=title, brand="Zorbex", category=["Apparel", "Coats"], price=80.0))


def _ids(eng, text: str, k: int = 10, **kw) -> list[str]:
    return [h.id for h in eng.search(SearchRequest(text=text, k=k, use_intent=False, **kw)).results]


def test_an_engine_serving_loaded_indexes_catches_up_and_matches_one_that_opened_them(
        engine, settings_factory, encoder, tmp_path):
    from vitrine.search.engine import Engine

    first = engine_copy(engine, settings_factory, encoder, tmp_path / "d")
    loaded = first.loaded_indexes()
    first.index.close()
    assert loaded.seq > 0 and loaded.snapshot_version is not None
    # another process writes after the indexes were loaded: one new product, one deleted
    writer = Engine(settings_factory(tmp_path / "d"), encoder)
    gone = next(iter(sorted(writer.records.ids())))
    assert writer.upsert([_product("shared-1", "Shared indexes test parka")]).upserted == 1
    assert writer.delete([gone]) == 1
    writer.save()

    adopted = Engine(settings_factory(tmp_path / "d"), encoder, loaded)
    rec = adopted.recovery
    assert rec["shared"] is True and rec["replayed"] == 2 and rec["snapshot_seq"] == loaded.seq
    assert len(adopted) == SUBSET_SIZE == len(writer)
    assert adopted.index.seq == writer.index.seq
    # the adopting engine serves the very objects it was given (shared pages after a fork)
    assert adopted.graph is loaded.graph and adopted.filters is loaded.filters
    assert adopted.vectors["fused"] is loaded.vectors["fused"]
    for text in ("black shoes", "Zorbex parka", "red dress for women"):
        assert _ids(adopted, text) == _ids(writer, text), text
    assert _ids(adopted, "parka", 5, filters=Filters(brand="Zorbex")) == ["shared-1"]
    assert gone not in _ids(adopted, "shoes", 100)
    assert adopted.facets(["brand", "category"]) == writer.facets(["brand", "category"])
    # the BM25 postings and the suggestion index were handed over too, and follow the changes
    assert loaded.text_index is not None and loaded.suggestions is not None
    for text in ("parka", "black shoes"):
        assert adopted.records.bm25_scores(text) == writer.records.bm25_scores(text)
    # (the suggestion indexes, the writer's from its snapshot and the one handed over, are older than
    # the writes: they answer while they are rebuilt in the background, as after any write)
    t_end = time.monotonic() + 30
    while not ([x.text for x in adopted.suggest("zorb").suggestions] ==
               [x.text for x in writer.suggest("zorb").suggestions] == ["Zorbex"]):
        assert time.monotonic() < t_end
        time.sleep(0.1)
    # a write of its own lands in the indexes it adopted
    assert adopted.upsert([_product("shared-2", "Adopted write")]).upserted == 1
    assert len(adopted) == SUBSET_SIZE + 1
    writer.index.close()
    adopted.index.close()


def test_indexes_of_another_record_store_are_not_served(engine, settings_factory, encoder, tmp_path):
    from vitrine.search.engine import Engine

    first = engine_copy(engine, settings_factory, encoder, tmp_path / "d")
    loaded = first.loaded_indexes()
    first.index.close()
    other = Engine(settings_factory(tmp_path / "empty"), encoder, loaded)  # a new, empty store
    assert "shared" not in other.recovery and len(other) == 0
    other.index.close()
