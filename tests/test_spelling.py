"""A misspelt or run-together query word is read as the catalogue's word before every signal
(vitrine/search/spelling.py), through the HTTP API over the session engine (a real subset)."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient


@pytest.fixture(scope="module")
def client(engine):
    from vitrine.web.app import create_app

    with TestClient(create_app(engine=engine)) as c:
        yield c


def search(client, text: str, k: int = 10) -> dict:
    r = client.post("/v1/search", json={"text": text, "k": k})
    assert r.status_code == 200, r.text
    return r.json()


def ids(body: dict) -> list[str]:
    return [h["id"] for h in body["results"]]


def test_a_misspelt_word_is_searched_as_the_catalogue_word_by_every_signal(client):
    right, wrong = search(client, "black watch"), search(client, "black wacth")
    assert "corrected" not in right["query"]
    assert wrong["query"]["text"] == "black wacth"  # as typed
    assert wrong["query"]["corrected"] == "black watch"
    assert wrong["query"]["corrections"] == [{"word": "wacth", "read_as": "watch"}]
    assert ids(wrong) == ids(right) and wrong["total"] == right["total"]


def test_a_run_together_word_is_split_into_two_catalogue_words(client):
    right, joined = search(client, "black watch"), search(client, "blackwatch")
    assert joined["query"]["corrected"] == "black watch"
    assert ids(joined) == ids(right)


def test_words_the_catalogue_holds_or_the_tower_knows_stay_as_typed(client, engine):
    from vitrine.index.bm25 import word_terms

    index = engine.records.text_index()
    assert index.frequency(word_terms("shirt")[0]) > 0
    assert "corrected" not in search(client, "shirt")["query"]
    # not in this catalogue, but a word of the text tower's own: a synonym to it, never a typo
    assert index.frequency(word_terms("telescope")[0]) == 0 and engine.encoder.reads_as_word("telescope")
    assert "corrected" not in search(client, "telescope")["query"]
    assert "corrected" not in search(client, "teh")["query"]  # under 4 letters: no edit allowed
    # a word and an inflection the tower knows ("tee" ##s) is a word too: never read as "trees"
    assert engine.encoder.reads_as_word("tees") and not engine.encoder.reads_as_word("foutains")
    assert "corrected" not in search(client, "mens white tees")["query"]


def test_the_latin_words_of_a_chinese_query_are_read_too(client):
    """A Chinese query read into this English catalogue's words keeps its Latin words as typed:
    a misspelt one is read as the catalogue's, as in an English query, and the reading still
    counts as read in full (searched as English)."""
    right, wrong = search(client, "black 手表"), search(client, "blakc 手表")
    assert wrong["query"]["translated"] == "blakc watch" and wrong["query"]["corrected"] == "black watch"
    assert wrong["query"]["corrections"] == [{"word": "blakc", "read_as": "black"}]
    assert wrong["query"]["text"] == "blakc 手表"
    assert ids(wrong) == ids(right) and wrong["total"] == right["total"]


def test_query_spelling_can_be_turned_off(client, engine):
    engine.settings.search.query_spelling = False
    try:
        assert "corrected" not in search(client, "black wacth")["query"]
    finally:
        engine.settings.search.query_spelling = True


def test_products_holding_two_terms_equal_a_brute_force_count(engine):
    from vitrine.index.bm25 import word_terms

    index = engine.records.text_index()
    for a, b in (("black", "watch"), ("men", "shirt"), ("blue", "jeans"), ("watch", "zzzz")):
        both = set(engine.records.bm25_scores(a)) & set(engine.records.bm25_scores(b))
        assert index.frequency(word_terms(a)[0], word_terms(b)[0]) == len(both), (a, b)
    assert np.all([index.frequency(word_terms(w)[0]) > 0 for w in ("black", "watch")])


def test_equally_close_readings_are_told_apart_by_the_other_words(fresh_engine):
    """"pums" is one edit from both "puma" and "pumps": beside "benecio" it reads as the one the
    products hold together with benecio, alone as the one more products hold; and "barstool" splits
    into the two words the products hold together ("bar stool", not "bars tool")."""
    from vitrine.index.bm25 import word_terms
    from vitrine.search import spelling
    from vitrine.search.models import Product
    from vitrine.search.writes import ProductInput

    titles = ["Puma benecio sneakers", "Puma running shoes", "Vans canvas shoes", "Black pumps heels", "Red pumps heels",
              "Party pumps", "Wooden bar stool", "Metal bar stool", "Bars of soap", "Tool kit", "Garden tool set"]
    fresh_engine.upsert([ProductInput(Product(id=f"p{i}", title=t, category=["Shoes"]))
                         for i, t in enumerate(titles)])
    index = fresh_engine.records.text_index()
    knows = fresh_engine.encoder.reads_as_word

    def read(text: str) -> str:
        got = spelling.correct(text, index, knows)
        return got.text if got is not None else text

    def terms(text: str) -> list[str]:
        return [t for w in text.split() for t in word_terms(w)]

    assert knows("pumps") and knows("stool")  # the tower's vocabulary is the real one
    assert terms(read("pums benecio")) == terms("puma benecio")  # "puma" or "pumas": the term puma
    assert terms(read("pums")) == terms("pumps")  # three products against two
    assert read("barstool") == "bar stool"
    assert read("Pums heels").startswith("Pump") and read("pums heels").startswith("pump")  # as typed
    assert read("Vasn pumps") == "Vans pumps"  # as close as "Van", and of the typed length
    assert read("pumps xr500") == "pumps xr500"  # held words and words with digits stay
