"""Pages, sort orders, facet counts, highlights and typo tolerance, through the HTTP API over the
session engine (a real subset of the catalogue), each checked against a brute-force answer."""

from __future__ import annotations

from collections import Counter

import pytest
from fastapi.testclient import TestClient


@pytest.fixture(scope="module")
def client(engine):
    from vitrine.web.app import create_app

    with TestClient(create_app(engine=engine)) as c:
        yield c


@pytest.fixture(scope="module")
def priced(settings_factory, encoder, subset_rows, tmp_path_factory):
    """An engine of its own over 80 products of the subset, given prices (the catalogue has none)."""
    from conftest import SOURCE
    from vitrine.ingest.fashion import to_record
    from vitrine.search.engine import Engine
    from vitrine.search.writes import ProductInput
    from vitrine.search.models import Product
    from vitrine.web.app import create_app

    eng = Engine(settings_factory(tmp_path_factory.mktemp("priced"), intent=False), encoder)
    items = []
    for n, r in enumerate(subset_rows[:80]):
        rec = to_record(r, None)
        rec.pop("image", None)
        rec["price"] = float((int(r["id"]) * 37) % 4000 + 99) if n % 9 else None  # some without a price
        items.append(ProductInput(Product.model_validate(rec), image=(SOURCE / "images" / f"{r['id']}.jpg").read_bytes()))
    assert eng.upsert(items).upserted == 80
    with TestClient(create_app(engine=eng)) as c:
        yield c, eng
    eng.close()


def search(client, **body):
    r = client.post("/v1/search", json={"use_intent": False, **body})
    assert r.status_code == 200, r.text
    return r.json()


def ids(body):
    return [h["id"] for h in body["results"]]


@pytest.fixture(scope="module")
def small_category(client):
    """A category leaf with 8-40 products of the subset (a filter the pool can rank exhaustively)."""
    cats = client.get("/v1/facets", params={"field": "category", "limit": 1000}).json()["facets"]["category"]
    return next(c["value"] for c in cats if 8 <= c["count"] <= 40)


def test_pages_are_slices_of_one_stable_order(client):
    whole = search(client, text="men black casual shoes", k=24)
    pages = [search(client, text="men black casual shoes", k=8, offset=o) for o in (0, 8, 16)]
    got = [i for p in pages for i in ids(p)]
    assert got == ids(whole) and len(set(got)) == 24
    assert [p["offset"] for p in pages] == [0, 8, 16]
    assert all(p["total"] == whole["total"] and p["pool"] == whole["pool"] for p in pages)
    assert whole["total_exact"] is False and 0 < whole["total"] <= whole["pool"]
    again = search(client, text="men black casual shoes", k=8, offset=8)
    assert ids(again) == ids(pages[1])  # unchanged catalogue: the same page


def test_total_is_exact_when_the_filters_leave_fewer_than_the_pool(client, small_category, engine):
    body = search(client, text="stylish", k=5, filters={"category": small_category})
    assert body["total_exact"] is True and body["pool"] <= engine.settings.search.max_k
    assert body["pool"] == len(engine.allowed_ids(__import__("vitrine.search.models", fromlist=["Filters"])
                                                  .Filters(category=small_category)))


@pytest.mark.parametrize("body,field", [
    ({"text": "shoes", "offset": -1}, "offset"),
    ({"text": "shoes", "offset": 95, "k": 10}, "offset + k"),
    ({"text": "shoes", "sort": "cheapest"}, "sort"),
    ({"text": "shoes", "facets": ["flavour"]}, "facets"),
    ({"text": "shoes", "facets": ["brand"] * 6}, "facets"),
    ({"text": "shoes", "highlight": "maybe"}, "highlight"),
])
def test_bad_values_are_422_naming_the_field(client, body, field):
    r = client.post("/v1/search", json=body)
    assert r.status_code == 422, r.text
    assert field in r.json()["error"]["message"]


def _all_matching(client, **body):
    """Every matching product, by paging through the price order (brute force)."""
    first = search(client, **body, k=10, sort="price_asc")
    out = ids(first)
    while len(out) < first["total"]:
        out += ids(search(client, **body, k=10, offset=len(out), sort="price_asc"))
    return first, out


@pytest.mark.parametrize("order", ["price_asc", "price_desc", "newest"])
def test_sorted_orders_hold_only_products_above_the_floor(priced, order):
    client, eng = priced
    rel = search(client, text="women shoes", k=80)
    body = search(client, text="women shoes", k=80, sort=order)
    assert body["sort"] == order and len(body["results"]) == body["total"] == rel["total"]
    assert set(ids(body)) == set(ids(rel)[: rel["total"]])  # the same products, above the floor
    assert rel["total"] < rel["pool"]  # the floor left some of the pool out
    if order != "newest":
        prices = [h.get("price") for h in body["results"]]
        have = [p for p in prices if p is not None]
        assert have == sorted(have, reverse=order == "price_desc")
        assert prices[len(have):] == [None] * (len(prices) - len(have))  # no price: last
    else:
        seqs = [eng.records.get(i).seq for i in ids(body)]
        assert seqs == sorted(seqs, reverse=True)


def test_facet_counts_are_the_counts_of_the_matching_products(priced):
    client, eng = priced
    _, every = _all_matching(client, text="black")
    facets = search(client, text="black", facets=["gender", "colour", "brand", "category", "price"])["facets"]
    docs = [eng.get(i) for i in every]
    assert {f["value"]: f["count"] for f in facets["gender"]} == \
        dict(Counter(d.attributes["gender"] for d in docs if d.attributes.get("gender")))
    assert {f["value"]: f["count"] for f in facets["category"]} == \
        dict(Counter(c for d in docs for c in dict.fromkeys(d.category)))
    # brands are the record's own or the one learned from its title (filters, facets and rules share
    # that notion): at least every product with a brand field, and learned brands on top
    assert sum(f["count"] for f in facets["brand"]) >= sum(1 for d in docs if d.brand)
    prices = [d.price for d in docs if d.price is not None]
    assert len(facets["price"]) >= 3
    for rng in facets["price"]:
        lo, hi = rng["min"], rng.get("max")
        assert rng["count"] == sum(1 for p in prices if p >= lo and (hi is None or p < hi))
    assert sum(r["count"] for r in facets["price"]) == len(prices)


def test_highlights_are_spans_of_the_query_words(client, subset_rows):
    title = subset_rows[3]["productDisplayName"]
    words = title.split()[:2]
    body = search(client, text=" ".join(words), k=5, highlight=True)
    assert body["results"][0]["id"] == subset_rows[3]["id"]
    for hit in body["results"]:
        for field, spans in hit["highlights"].items():
            for sp in spans:
                frag = hit[field][sp["start"]:sp["end"]]
                assert frag and "<" not in frag
    top = body["results"][0]
    marked = {top["title"][s["start"]:s["end"]].casefold() for s in top["highlights"]["title"]}
    assert {w.casefold() for w in words} <= marked
    plain = search(client, text=" ".join(words), k=5)
    assert "highlights" not in plain["results"][0]


def test_a_typo_is_forgiven_by_bm25_and_the_highlights(client, engine, subset_rows):
    brand = next(r["productDisplayName"].split()[0] for r in subset_rows
                 if len(r["productDisplayName"].split()[0]) >= 5)
    typo = brand[:2] + brand[1] + brand[2:]  # one letter doubled: "Addidas"
    right, wrong = engine.records.bm25_scores(brand), engine.records.bm25_scores(typo)
    assert len(right) > 0 and dict(wrong.items()) == dict(right.items())
    body = search(client, text=f"{typo} shoes", k=5, highlight=True)
    hit = next(h for h in body["results"] if h["title"].split()[0] == brand)
    assert any(hit["title"][s["start"]:s["end"]] == brand for s in hit["highlights"]["title"])


def test_v1_and_the_old_paths_answer_alike(client):
    a = client.post("/v1/search", json={"text": "watch", "k": 3, "use_intent": False}).json()
    b = client.post("/search", json={"text": "watch", "k": 3, "use_intent": False}).json()
    assert ids(a) == ids(b)
    assert client.get("/v1/health").json()["status"] == "ok" == client.get("/health").json()["status"]


def test_openapi_lists_every_error_and_an_example_for_every_body(client):
    schema = client.get("/openapi.json").json()
    paths = schema["paths"]
    assert all(p.startswith("/v1/") for p in paths)
    for path, ops in paths.items():
        for method, op in ops.items():
            codes = set(op["responses"])
            assert {"422", "500", "503", "504"} <= codes, (method, path, codes)
            for code, resp in op["responses"].items():
                if code.startswith(("4", "5")):
                    assert resp["content"]["application/json"]["example"]["error"]["status"] == int(code)
    search_op = paths["/v1/search"]["post"]
    assert "404" not in search_op["responses"]
    # a search needs no key, but a scoped key may have expired (401) or not cover it (403), and a
    # client past its rate gets 429 (vitrine/web/limits.py)
    assert {"401", "403", "429"} <= set(search_op["responses"])
    assert "404" in paths["/v1/products/{pid}"]["get"]["responses"]
    comps = schema["components"]["schemas"]
    for name in ("SearchRequest", "SearchResponse", "ProductOut", "Product", "CompareRequest", "CompareResponse",
                 "RecommendResponse", "FacetsResponse", "Filters", "SwapRequest", "SwapReport"):
        assert comps[name].get("examples"), name


def test_typo_tolerance_corrects_only_words_no_product_holds(engine):
    """A word the catalogue holds scores exactly as FTS5 scores it; an unknown one scores as its
    closest catalogue term, and never under 4 letters."""
    from vitrine.index import symbolic
    from vitrine.index.bm25 import MemoryBM25

    mem = MemoryBM25(engine.records.path)
    try:
        for q in ("shirt", "black watch", "shrit", "blakc watch", "teh"):
            got = mem.scores(q, engine.records.seq)
            with engine.records._lock:
                exact = symbolic.scores(engine.records._conn, q)
            fixed = {"shrit": "shirt", "blakc watch": "black watch"}.get(q)
            if fixed is None:
                assert dict(got.items()) == exact, q
            else:
                with engine.records._lock:
                    assert dict(got.items()) == symbolic.scores(engine.records._conn, fixed), q
        assert mem.correct("shrit", "shrit") == "shirt" and mem.correct("teh", "teh") is None
    finally:
        mem.close()


def test_highlighter_memo_and_length_prefilter_agree_with_brute_force(subset_rows):
    """The per-query memo of field words and the length prefilter change no span: every word is
    checked again by brute force (its term or itself within the allowed edits of a query word's)."""
    import re

    from vitrine.index import fuzzy
    from vitrine.index.bm25 import word_terms
    from vitrine.search.storefront import Highlighter

    def brute(words, text):
        out = []
        for m in re.finditer(r"\w+", text):
            low = m.group().casefold()
            terms = word_terms(low)
            term = terms[0] if len(terms) == 1 else low
            if any(term == t or low == w or fuzzy.distance(low, w) <= e or fuzzy.distance(term, t) <= e
                   for w, t, e in words):
                out.append((m.start(), m.end()))
        return out

    titles = [r["productDisplayName"] for r in subset_rows[:60]]
    queries = ["addidas runing shoes", "men blue tshirt", "Puma casual shoe", "womens handbags black", "watch"]
    checked = 0
    for q in queries:
        marks = Highlighter(q)
        for title in titles * 2:  # twice: the second pass answers from the memo
            want = brute(marks.words, title)
            assert [(s.start, s.end) for s in marks.spans(title)] == want
            checked += len(want)
    assert checked > 0
