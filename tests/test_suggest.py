"""Search-as-you-type suggestions (GET /v1/suggest) and the UI's config (GET /v1/ui/config),
through the HTTP API over the subset engine; the index's own behaviour beside them."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from vitrine.index import suggest as sg

KINDS = {"query", "title", "category", "brand", "facet"}


@pytest.fixture(scope="module")
def client(engine):
    from vitrine.web.app import create_app

    with TestClient(create_app(engine=engine)) as c:
        yield c


@pytest.fixture()
def write_client(fresh_engine):
    from pydantic import SecretStr

    from vitrine.web.app import create_app

    fresh_engine.settings.web.api_key = SecretStr("s3cret")
    with TestClient(create_app(engine=fresh_engine)) as c:
        yield c


def texts(body: dict) -> list[str]:
    return [s["text"] for s in body["suggestions"]]


def put(c: TestClient, pid: str, title: str, **kw) -> None:
    r = c.put(f"/v1/products/{pid}", json={"id": pid, "title": title, **kw}, headers={"X-API-Key": "s3cret"})
    assert r.status_code == 200, r.text


def test_prefix_completes_from_the_catalogue(client):
    r = client.get("/v1/suggest", params={"q": "sh", "k": 8})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["q"] == "sh" and body["took_ms"] >= 0
    assert 1 <= len(body["suggestions"]) <= 8
    for s in body["suggestions"]:
        assert s["kind"] in KINDS and isinstance(s["score"], float)
        assert any(w.startswith("sh") for w in sg.tokens(s["text"])), s
    scores = [s["score"] for s in body["suggestions"]]
    assert scores == sorted(scores, reverse=True)
    # a category the subset holds is among them, before any title
    kinds = [s["kind"] for s in body["suggestions"]]
    assert "category" in kinds


def test_every_word_of_the_prefix_matches(client):
    body = client.get("/v1/suggest", params={"q": "men sh"}).json()
    assert body["suggestions"]
    for t in texts(body):
        ws = sg.tokens(t)
        assert any(w.startswith("men") for w in ws) and any(w.startswith("sh") for w in ws), t


def test_typo_tolerant(client):
    exact = texts(client.get("/v1/suggest", params={"q": "tshirts"}).json())
    assert any("tshirts" in t.casefold() for t in exact)
    for typo in ("tshrits", "thsirts"):  # a swap of two neighbours is one edit
        got = texts(client.get("/v1/suggest", params={"q": typo}).json())
        assert any("tshirt" in t.casefold() for t in got), (typo, got)
    # a typo in an earlier word too
    got = texts(client.get("/v1/suggest", params={"q": "tshrits bl"}).json())
    assert any("tshirt" in t.casefold() and "bl" in t.casefold() for t in got), got


def test_short_words_are_not_forgiven(client):
    # under 4 letters no edit is allowed: a prefix no word starts with finds nothing
    assert client.get("/v1/suggest", params={"q": "qzx"}).json()["suggestions"] == []


def test_k_bounds(client):
    assert len(client.get("/v1/suggest", params={"q": "s", "k": 3}).json()["suggestions"]) == 3
    assert len(client.get("/v1/suggest", params={"q": "s", "k": 1}).json()["suggestions"]) == 1
    for bad in (0, -1, 51, "x"):
        r = client.get("/v1/suggest", params={"q": "s", "k": bad})
        assert r.status_code == 422, (bad, r.text)
        assert r.json()["error"]["code"] in ("invalid_input", "validation_error", "unprocessable")
    assert client.get("/v1/suggest", params={"q": "s" * 201}).status_code == 422


def test_empty_prefix_gives_catalogue_examples(client, engine):
    got = client.get("/v1/suggest", params={"q": "", "k": 6}).json()["suggestions"]
    assert 1 <= len(got) <= 6
    assert {s["kind"] for s in got} <= {"query", "facet", "category", "brand"}
    facets = engine.facets(["category"], 1000).facets["category"]
    cats = {f.value.casefold() for f in facets}
    assert any(s["text"].casefold() in cats or s["text"].split()[-1].casefold() in cats for s in got)


def test_ui_config(client):
    body = client.get("/v1/ui/config").json()
    assert body["photos"] is True and body["products"] == 240
    assert body["events_key"] is None  # no events key configured: the UI sends no events
    assert body["examples"] and "red dress for women" not in body["examples"]


def test_ui_config_of_a_text_only_catalogue_with_an_events_key(write_client, fresh_engine):
    from pydantic import SecretStr

    put(write_client, "L1", "Broadway Lever Door Handle", category="Hardware > Door Handles", brand="Broadway")
    put(write_client, "S1", "Surge Protector 6 Outlet", category="Electronics > Power > Surge Protectors")
    fresh_engine.settings.web.events_key = SecretStr("browser-key")
    body = write_client.get("/v1/ui/config").json()
    assert body["photos"] is False and body["products"] == 2
    assert body["events_key"] == "browser-key"  # the events-only key, never the write key
    assert "s3cret" not in str(body)
    assert body["examples"]


def test_follows_catalogue_changes_and_chinese(write_client):
    put(write_client, "C1", "红色连衣裙 夏季", category="服装 > 连衣裙")
    put(write_client, "C2", "Lenovo ThinkPad Laptop", category="Electronics > Laptops", brand="Lenovo")
    got = texts(write_client.get("/v1/suggest", params={"q": "连衣"}).json())
    assert "红色连衣裙 夏季" in got and "连衣裙" in got  # inside a run of Chinese characters too
    assert "红色连衣裙 夏季" in texts(write_client.get("/v1/suggest", params={"q": "红色"}).json())
    assert "Lenovo" in texts(write_client.get("/v1/suggest", params={"q": "leno"}).json())
    # a product deleted or added changes the suggestions at once
    assert write_client.delete("/v1/products/C2", headers={"X-API-Key": "s3cret"}).status_code == 200
    assert "Lenovo" not in texts(write_client.get("/v1/suggest", params={"q": "leno"}).json())
    put(write_client, "C3", "Levi's Denim Jacket", category="Apparel > Jackets", brand="Levi's")
    assert "Levi's" in texts(write_client.get("/v1/suggest", params={"q": "levi"}).json())


def test_a_slow_catalogue_index_is_rebuilt_at_most_once_per_spacing(write_client, monkeypatch):
    """Where a build is slow (every build counts as slow here), writes do not start a rebuild
    each: the old index answers until REBUILD_SPACING builds' time has passed since the last."""
    import time

    from vitrine.search import suggestions as sugg

    put(write_client, "S1", "Lenovo ThinkPad Laptop", brand="Lenovo")
    assert "Lenovo" in texts(write_client.get("/v1/suggest", params={"q": "leno"}).json())
    monkeypatch.setattr(sugg, "INLINE_BUILD_S", 0.0)
    monkeypatch.setattr(sugg, "REBUILD_SPACING", 1e9)
    put(write_client, "S2", "Levi's Denim Jacket", brand="Levi's")
    for _ in range(5):  # not rebuilt: the last build was less than the spacing ago
        assert "Levi's" not in texts(write_client.get("/v1/suggest", params={"q": "levi"}).json())
        time.sleep(0.1)
    monkeypatch.setattr(sugg, "REBUILD_SPACING", 0.0)
    t_end = time.monotonic() + 30  # now due: rebuilt in the background, the old index answering meanwhile
    while "Levi's" not in texts(write_client.get("/v1/suggest", params={"q": "levi"}).json()):
        assert time.monotonic() < t_end
        time.sleep(0.05)


def test_popular_queries_with_clicks_only(write_client, fresh_engine):
    put(write_client, "P1", "Red Cotton Shirt", category="Apparel > Shirts")
    calls = []

    def popular():
        calls.append(1)
        return [("red shirt for office", 12.0), ("red zzqx nothing found", 0.0), ("reddish", -1.0), ("", 3.0)]

    fresh_engine.suggestions.set_popular(popular)
    got = write_client.get("/v1/suggest", params={"q": "red"}).json()["suggestions"]
    assert got[0] == {"text": "red shirt for office", "kind": "query", "score": got[0]["score"]}
    assert all("zzqx" not in s["text"] and s["text"] != "reddish" for s in got)
    assert texts(write_client.get("/v1/suggest", params={"q": "red s"}).json())[0] == "red shirt for office"
    assert write_client.get("/v1/ui/config").json()["examples"][0] == "red shirt for office"
    # a failing provider keeps the queries it gave last
    fresh_engine.suggestions.set_popular(lambda: (_ for _ in ()).throw(RuntimeError("log down")))
    assert "red shirt for office" in texts(write_client.get("/v1/suggest", params={"q": "red"}).json())
    fresh_engine.suggestions.set_popular(None)
    assert "red shirt for office" not in texts(write_client.get("/v1/suggest", params={"q": "red"}).json())


def test_popular_queries_refresh_in_the_background(fresh_engine):
    import time

    from vitrine.search.suggestions import Suggestions

    pops = [[("blue jeans", 3.0)]]
    s = Suggestions(fresh_engine.index, lambda: pops[-1], refresh_s=0.05)
    s.refresh_queries()
    assert [m.text for m in s.lookup("blu", 5)] == ["blue jeans"]
    pops.append([("black boots", 2.0)])
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and [m.text for m in s.lookup("bl", 5)] != ["black boots"]:
        time.sleep(0.06)
    assert [m.text for m in s.lookup("bl", 5)] == ["black boots"]


def test_index_unit():
    idx = sg.SuggestIndex([sg.Phrase("Running Shoes", "category", 40), sg.Phrase("Nike Men Running Shoe", "title"),
                           sg.Phrase("Café Crème Mug", "title"), sg.Phrase("Nike", "brand", 9, example=True),
                           sg.Phrase("running shoes", "title", 3)])
    assert len(idx) == 4  # the same phrase once (the heavier kind)
    got = idx.lookup("runn", 5)
    assert [m.text for m in got][:2] == ["Running Shoes", "Nike Men Running Shoe"]
    assert got[0].score > 2 > got[1].score > 1
    assert [m.text for m in idx.lookup("shoe run", 5)] == ["Running Shoes", "Nike Men Running Shoe"]
    assert [m.text for m in idx.lookup("cafe cre", 5)] == ["Café Crème Mug"]  # diacritics ignored
    typo = idx.lookup("rnuning", 5)
    assert typo and all(m.score < 1 for m in typo)
    assert "running" in idx.words and "café" not in idx.words and "cafe" in idx.words
    assert [m.text for m in idx.top(3)] == ["Nike"]
    assert idx.lookup("", 3) == idx.top(3)
    assert sg.query_phrases([("a", 1), ("b", 0), ("c", float("nan")), ("d", "x")]) == [sg.Phrase("a", "query", 1.0)]


def test_index_saved_and_loaded_answers_the_same(tmp_path):
    from vitrine.errors import StorageError

    phrases = [sg.Phrase("Running Shoes", "category", 40), sg.Phrase("Nike Men Running Shoe", "title"),
               sg.Phrase("Café Crème Mug", "title"), sg.Phrase("Nike", "brand", 9, example=True),
               sg.Phrase("红色连衣裙 夏季", "title"), sg.Phrase("Nike running", "query", 3)]
    idx = sg.SuggestIndex(phrases)
    path = tmp_path / "suggestions.varr"
    sha = idx.save(path, {"seq": 7})
    got, meta = sg.SuggestIndex.load(path, sha)
    assert meta == {"seq": 7} and len(got) == len(idx) and got.words == idx.words
    for q in ("runn", "shoe run", "cafe cre", "rnuning", "连衣", "nike r", "", "zzz"):
        assert got.lookup(q, 5) == idx.lookup(q, 5), q
    empty = sg.SuggestIndex(())
    sha = empty.save(tmp_path / "empty.varr")
    assert sg.SuggestIndex.load(tmp_path / "empty.varr", sha)[0].lookup("a", 3) == []
    raw = bytearray(path.read_bytes())
    raw[-40] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(StorageError, match="checksum"):
        sg.SuggestIndex.load(path, sha)


def test_the_catalogue_and_bm25_indexes_are_kept_with_the_snapshot(engine, settings_factory, encoder, tmp_path,
                                                                    monkeypatch):
    """A restart serves the catalogue's suggestion index and the BM25 postings the last snapshot
    version kept (building them reads every product: minutes at 1M), not ones built again. Every
    rebuild runs in the background here, as on a loaded machine or a large catalogue."""
    from conftest import engine_copy
    from vitrine.search import suggestions

    monkeypatch.setattr(suggestions, "INLINE_BUILD_S", 0.0)

    eng = engine_copy(engine, settings_factory, encoder, tmp_path / "copy")
    try:
        want = eng.suggest("shi", 8).suggestions
        scores = dict(eng.records.bm25_scores("blue cotton shirt").items())
        assert want and scores
        eng.save()  # newly built indexes make a new version due (the copy may have loaded them already)
        files = eng.snapshots.versions()[0].manifest["files"]
        assert "suggestions.varr" in files and "bm25.varr" in files
        # a version after a write the suggestions have not been rebuilt for links the same file,
        from vitrine.search.models import Product
        from vitrine.search.writes import ProductInput

        eng.upsert([ProductInput(Product(id="kept-1", title="Quokka enamel mug", category=["Home"]))])
        assert eng.save()
        newest, before = eng.snapshots.versions()[:2]
        assert (newest.path / "suggestions.varr").stat().st_ino == (before.path / "suggestions.varr").stat().st_ino
        # so are the BM25 postings, not asked since (they follow the write when next asked)
        assert (newest.path / "bm25.varr").stat().st_ino == (before.path / "bm25.varr").stat().st_ino
        want = eng.suggest("shi", 8).suggestions
        scores = dict(eng.records.bm25_scores("blue cotton shirt").items())
        # the rebuild after the write runs in the background (a build over INLINE_BUILD_S, 20 ms: a
        # loaded machine); once done it makes a new version due, which close() would write after the
        # one read here (one version more than saved): the snapshot below is taken once it is done
        assert eng.suggestions.settle()
        want = eng.suggest("shi", 8).suggestions
        eng.save()
        version = eng.snapshot_version
    finally:
        eng.close()
    again = engine_copy(eng, settings_factory, encoder, tmp_path / "again")
    try:
        assert again.snapshot_version == version and again.recovery["text_index_loaded"]
        assert again.suggestions.catalogue(wait=False) is not None  # there at once, not being built
        assert again.suggest("shi", 8).suggestions == want
        assert dict(again.records.bm25_scores("blue cotton shirt").items()) == scores
    finally:
        again.close()
