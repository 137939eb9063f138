"""Recommendations (similar / complementary) and comparisons: engine and HTTP, real subset."""

from __future__ import annotations

import random

import pytest
from fastapi.testclient import TestClient

from vitrine.errors import InvalidInput, NotFound
from vitrine.index.vocabulary import norm_key


@pytest.fixture(scope="module")
def client(engine):
    from vitrine.web.app import create_app

    with TestClient(create_app(engine=engine)) as c:
        yield c


def row_of(subset_rows, **want):
    return next(r for r in subset_rows if all(r[k] == v for k, v in want.items()))


# -- similar ---------------------------------------------------------------------------------------------
def test_similar_is_same_category_diverse_and_never_itself(engine, subset_rows):
    for r in [row_of(subset_rows, articleType="Tshirts", gender="Men"), row_of(subset_rows, articleType="Watches")]:
        res = engine.recommend(r["id"], "similar", k=5)
        assert res.anchor.id == r["id"] and res.kind == "similar"
        ids = [h.id for h in res.results]
        assert r["id"] not in ids and len(ids) == len(set(ids)) == 5
        assert all(h.category[-1] == r["articleType"] for h in res.results)
        assert all(h.relation == f"same category: {r['articleType']}" for h in res.results)
        assert all(h.explanation and "mmr" in h.explanation.signals for h in res.results)


def test_mmr_trades_relevance_for_diversity(engine, subset_rows):
    r = row_of(subset_rows, articleType="Tshirts", gender="Men")
    lam = engine.settings.search.mmr_lambda
    try:
        engine.settings.search.mmr_lambda = 1.0
        pure = engine.recommend(r["id"], "similar", k=8).results
        engine.settings.search.mmr_lambda = 0.3
        diverse = engine.recommend(r["id"], "similar", k=8).results
    finally:
        engine.settings.search.mmr_lambda = lam
    # lambda 1 is plain nearest-first; a lower lambda picks less mutually similar products
    assert [h.score for h in pure] == sorted((h.score for h in pure), reverse=True)

    def spread(hits):
        import numpy as np

        v = np.stack([engine.vector_of(h.id) for h in hits])
        s = v @ v.T
        return float(s[np.triu_indices(len(hits), 1)].mean())

    assert spread(diverse) < spread(pure)


# -- complementary --------------------------------------------------------------------------------------
def test_complementary_follows_the_graph(engine, subset_rows):
    rng = random.Random(4)
    anchors = rng.sample([r for r in subset_rows if r["gender"] in ("Men", "Women")], 25)
    total = good = 0
    for r in anchors:
        res = engine.recommend(r["id"], "complementary", k=6)
        comps = {norm_key(c) for c in engine.graph.complements_of(r["articleType"], r["gender"])}
        for h in res.results:
            total += 1
            assert h.id != r["id"]
            assert h.category[-1] != r["articleType"]  # never the anchor's own category
            assert norm_key(h.category[-1]) in comps
            assert h.relation.startswith(f"complements: {r['articleType']} -> {h.category[-1]}")
            assert "colour-compatible" in h.relation
            ok, _ = engine.graph.colour_compatible(r["baseColour"], h.attributes.get("colour"))
            assert ok
            g = h.attributes.get("gender")
            assert g == r["gender"] or (g == "Unisex" and "unisex-compatible" in h.relation)
            good += g == r["gender"]
    assert total > 50 and good / total >= 0.95


def test_formal_shirt_gets_an_outfit(engine, subset_rows):
    r = row_of(subset_rows, articleType="Shirts", gender="Men", usage="Formal")
    cats = {h.category[-1] for h in engine.recommend(r["id"], "complementary", k=10).results}
    assert len(cats) >= 4  # spread over complementary categories, not ten belts
    assert cats & {"Trousers", "Formal Shoes", "Belts", "Ties", "Watches", "Wallets"}


def test_recommend_bad_input(engine, subset_rows):
    with pytest.raises(NotFound, match="no-such"):
        engine.recommend("no-such", "similar")
    pid = subset_rows[0]["id"]
    with pytest.raises(InvalidInput, match="kind"):
        engine.recommend(pid, "cheaper")
    with pytest.raises(InvalidInput, match="k must"):
        engine.recommend(pid, "similar", k=0)


# -- compare ----------------------------------------------------------------------------------------------
def test_compare_two_shoes(engine, subset_rows):
    shoes = [r for r in subset_rows if r["articleType"] == "Sports Shoes"][:2]
    ids = [r["id"] for r in shoes]
    res = engine.compare(ids)
    assert [p.id for p in res.products] == ids
    names = [a.name for a in res.attributes]
    assert names[:2] == ["brand", "category"] and "colour" in names
    cat = next(a for a in res.attributes if a.name == "category")
    assert cat.same and res.shared["category"] == "Sports Shoes"
    for a in res.attributes:
        assert set(a.values) == set(ids)
        assert (a.name in res.shared) == a.same and (a.name in res.differing) == (not a.same)
    (pair,) = res.pairwise
    assert pair.relation == "substitutes" and pair.a == ids[0] and pair.b == ids[1]
    assert -1 <= pair.photo <= 1 and -1 <= pair.text <= 1 and -1 <= pair.fused <= 1
    assert res.price_difference is None  # the bundled catalogue has no prices
    assert "substitutes" in res.summary and shoes[0]["productDisplayName"] in res.summary


def test_compare_relations_and_limits(engine, subset_rows):
    shirt = row_of(subset_rows, articleType="Shirts", gender="Men")["id"]
    trousers = row_of(subset_rows, articleType="Trousers", gender="Men")["id"]
    ball = row_of(subset_rows, articleType="Footballs")["id"]
    res = engine.compare([shirt, trousers, ball])
    rel = {(p.a, p.b): p.relation for p in res.pairwise}
    assert len(rel) == 3 and rel[(shirt, trousers)] == "complements" and rel[(shirt, ball)] == "unrelated"
    with pytest.raises(InvalidInput, match="at least 2"):
        engine.compare([shirt])
    with pytest.raises(InvalidInput, match="at most 5"):
        engine.compare([r["id"] for r in subset_rows[:6]])
    with pytest.raises(InvalidInput, match="duplicate"):
        engine.compare([shirt, shirt])
    with pytest.raises(NotFound, match="nope-42"):
        engine.compare([shirt, "nope-42"])


def test_compare_text_resolves_each_side(engine):
    res = engine.compare_text("nike vs puma sports shoes")
    a, b = res.products
    assert a.title.casefold().startswith("nike") and b.title.casefold().startswith("puma")
    assert a.category[-1] == b.category[-1] == "Sports Shoes"  # "sports shoes" completes the "nike" side
    with pytest.raises(InvalidInput, match="two things"):
        engine.compare_text("just nike shoes")


# -- HTTP ---------------------------------------------------------------------------------------------------
def test_http_recommend(client, subset_rows):
    pid = row_of(subset_rows, articleType="Shirts", gender="Men")["id"]
    r = client.get(f"/recommend/{pid}", params={"kind": "complementary", "k": 4})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["anchor"]["id"] == pid and body["kind"] == "complementary" and len(body["results"]) == 4
    assert all(h["relation"].startswith("complements:") and "image_url" in h for h in body["results"])
    assert client.get(f"/recommend/{pid}").json()["kind"] == "similar"
    r = client.get("/recommend/missing-77")
    assert r.status_code == 404 and "missing-77" in r.json()["error"]["message"]
    assert client.get(f"/recommend/{pid}", params={"kind": "nope"}).status_code == 422
    assert client.get(f"/recommend/{pid}", params={"k": 0}).status_code == 422
    assert client.get(f"/recommend/{pid}", params={"k": 100_000}).status_code == 422


def test_http_compare(client, subset_rows):
    ids = [r["id"] for r in subset_rows if r["articleType"] == "Watches"][:3]
    r = client.post("/compare", json={"ids": ids})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [p["id"] for p in body["products"]] == ids and len(body["pairwise"]) == 3
    assert set(body) >= {"products", "attributes", "shared", "differing", "pairwise", "price_difference",
                         "summary", "took_ms"}
    for bad in ([ids[0]], ids[:1] * 2, [r["id"] for r in subset_rows[:6]], []):
        rr = client.post("/compare", json={"ids": bad})
        assert rr.status_code == 422 and rr.json()["error"]["code"] == "invalid_input"
    rr = client.post("/compare", json={"ids": [ids[0], "ghost-1"]})
    assert rr.status_code == 404 and "ghost-1" in rr.json()["error"]["message"]
    assert client.post("/compare", json={"ids": ids, "text": "a vs b"}).status_code == 422
    assert client.post("/compare", json={}).status_code == 422
    rt = client.post("/compare", json={"text": "nike vs puma sports shoes"})
    assert rt.status_code == 200 and len(rt.json()["products"]) == 2
