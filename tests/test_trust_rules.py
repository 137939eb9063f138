"""Rules that cannot leak or mislead, through the HTTP API (real models, the subset catalogue in a
data dir of this module's own): reading rules needs the key, `priority` decides between rules,
`rules` in a response lists only rules that changed the results, filters of several rules
intersect, Chinese `contains` matches words, a filter no product matches is warned about; and the
brand the graph learned from titles is a search filter and a facet like a record's own brand."""

from __future__ import annotations

from collections import Counter

import pytest
from conftest import engine_and_client

KEY = {"X-API-Key": "trust-key"}
QUERY = "men black shoes"


eng, client = engine_and_client("trust-rules", api_key="trust-key")


@pytest.fixture(autouse=True)
def no_rules_left(client):
    yield
    for r in client.get("/v1/rules", headers=KEY).json():
        client.delete(f"/v1/rules/{r['id']}", headers=KEY)


def put(client, rid: str, body: dict) -> dict:
    r = client.put(f"/v1/rules/{rid}", json=body, headers=KEY)
    assert r.status_code == 200, r.text
    return r.json()


def search(client, **body) -> dict:
    r = client.post("/v1/search", json={"text": QUERY, "k": 10, **body})
    assert r.status_code == 200, r.text
    return r.json()


def ids(res: dict) -> list[str]:
    return [h["id"] for h in res["results"]]


def learned_brands(eng, subset_rows) -> Counter[str]:
    """Brute force: each subset product's brand as the graph read it (the subset has no brand field)."""
    out: Counter[str] = Counter()
    for r in subset_rows:
        facts = eng.graph.facts_of(r["id"])
        if facts is not None and facts.brand:
            out[facts.brand] += 1
    return out


def test_reading_rules_needs_the_key(client):
    put(client, "secret-campaign", {"conditions": {"query": {"is": "summer dress"}, "from": "2099-01-01T00:00:00Z"},
                                    "consequences": {"hide": []}})
    assert client.get("/v1/rules").status_code == 401
    assert client.get("/v1/rules/secret-campaign").status_code == 401
    assert client.get("/v1/rules", headers={"X-API-Key": "wrong"}).status_code == 401
    listed = client.get("/v1/rules", headers=KEY)
    assert listed.status_code == 200 and [r["id"] for r in listed.json()] == ["secret-campaign"]
    one = client.get("/v1/rules/secret-campaign", headers=KEY).json()
    assert one["active"] is False and one["priority"] == 0


def test_priority_decides_a_contested_pin_whatever_the_ids(client, subset_rows):
    base = ids(search(client, k=40))
    a, b = [r["id"] for r in subset_rows if r["id"] not in base][:2]
    pin = {"conditions": {"query": {"is": QUERY}}}
    put(client, "a-low", {**pin, "consequences": {"pin": [{"id": a, "position": 0}], "banner": {"text": "low"}}})
    put(client, "z-high", {**pin, "priority": 5,
                           "consequences": {"pin": [{"id": b, "position": 0}], "banner": {"text": "high"}}})
    res = search(client)
    assert res["results"][0]["id"] == b and res["banner"] == {"text": "high"}
    assert a not in ids(res)  # its position was taken by the higher rule
    assert res["rules"] == ["z-high"]  # a-low changed nothing: not listed
    # equal priorities: by id
    put(client, "z-high", {**pin, "consequences": {"pin": [{"id": b, "position": 0}], "banner": {"text": "high"}}})
    res = search(client)
    assert res["results"][0]["id"] == a and res["banner"] == {"text": "low"} and res["rules"] == ["a-low"]


def test_fired_lists_only_rules_that_changed_the_results(eng, client, subset_rows):
    base = search(client, k=10)
    shown = ids(base)
    pool = set(ids(search(client, k=100)))  # every product the query can show (max_k is 100)
    absent = next(r["id"] for r in subset_rows if r["id"] not in pool)
    on = {"conditions": {"query": {"contains": "shoes"}}}
    put(client, "hide-absent", {**on, "consequences": {"hide": [absent]}})
    put(client, "hide-shown", {**on, "consequences": {"hide": [shown[0]]}})
    put(client, "pin-in-place", {**on, "consequences": {"pin": [{"id": shown[1], "position": 0}]}})
    res = search(client, k=10)
    assert shown[0] not in ids(res)
    # hide-shown removed the top hit, so shown[1] is first without the pin: the pin changed nothing
    assert ids(res)[0] == shown[1]
    assert res["rules"] == ["hide-shown"]
    brands = learned_brands(eng, subset_rows)
    missing = "Indigo"
    assert missing not in brands
    r = client.put("/v1/rules/boost-nothing", headers=KEY, json={
        **on, "consequences": {"boost": [{"filter": {"brand": missing}, "weight": 1}]}})
    assert r.status_code == 200
    assert search(client, k=10)["rules"] == ["hide-shown"]


def test_a_filter_that_matches_nothing_is_stored_with_a_warning(eng, client, subset_rows):
    out = put(client, "indigo", {"conditions": {"query": {"contains": "shoes"}},
                                 "consequences": {"boost": [{"filter": {"brand": "Indigo"}, "weight": 0.3}]}})
    assert out["id"] == "indigo"
    assert len(out["warnings"]) == 1
    w = out["warnings"][0]
    assert w.startswith("consequences.boost[0].filter: no product matches") and "no product has the brand 'Indigo'" in w
    real = learned_brands(eng, subset_rows).most_common(1)[0][0]
    ok = put(client, "real", {"conditions": {"query": {"contains": "shoes"}},
                              "consequences": {"boost": [{"filter": {"brand": real}, "weight": 0.3}]}})
    assert "warnings" not in ok
    assert client.get("/v1/rules/indigo", headers=KEY).json()["consequences"]["boost"][0]["filter"] == {"brand": "Indigo"}


def test_filters_of_several_rules_intersect(eng, client):
    on = {"conditions": {"query": {"contains": "shoes"}}}
    put(client, "f1", {**on, "consequences": {"filters": {"gender": "Women"}}})
    put(client, "f2", {**on, "consequences": {"filters": {"colour": "White"}}})
    res = search(client, text="white shoes", k=20, facets=["gender", "colour"])
    assert res["results"]
    for h in res["results"]:
        facts = eng.graph.facts_of(h["id"])
        assert facts.gender == "Women" and facts.colour == "White", (h["id"], facts)
    assert [v["value"] for v in res["facets"]["gender"]] == ["Women"]
    assert [v["value"] for v in res["facets"]["colour"]] == ["White"]


def test_chinese_contains_matches_words_not_characters(client):
    put(client, "dress-zh", {"conditions": {"query": {"contains": "连衣裙"}}, "consequences": {"banner": {"text": "裙"}}})
    put(client, "bag-zh", {"conditions": {"query": {"contains": "包"}}, "consequences": {"banner": {"text": "包"}}})
    for text in ("红色连衣裙", "连衣裙 夏季", "红色的 连衣裙"):
        res = search(client, text=text)
        assert res.get("banner") == {"text": "裙"} and res["rules"] == ["dress-zh"], text
    assert "banner" not in search(client, text="面包")  # 包 is a character of 面包 (bread), not a word of it
    assert search(client, text="黑色 包")["banner"] == {"text": "包"}
    put(client, "two-words", {"conditions": {"query": {"contains": "红色连衣裙"}}, "priority": 1,
                              "consequences": {"banner": {"x": 1}}})
    res = search(client, text="夏季红色连衣裙")  # 红色 连衣裙 side by side: two-words holds and wins the banner
    assert res["banner"] == {"x": 1} and res["rules"] == ["two-words"]  # dress-zh held but changed nothing
    res = search(client, text="红色上衣 连衣裙")  # both words, not side by side
    assert res["banner"] == {"text": "裙"} and res["rules"] == ["dress-zh"]


# -- one notion of brand: filter and facet ---------------------------------------------------------------
def test_learned_brand_is_a_search_filter_and_a_facet(eng, client, subset_rows):
    brands = learned_brands(eng, subset_rows)
    assert brands, "the graph learned no brand from the subset's titles"
    facets = client.get("/v1/facets", params={"fields": "brand", "limit": 1000}).json()["facets"]["brand"]
    assert {v["value"]: v["count"] for v in facets} == dict(brands)  # brute force over every product
    brand, n = brands.most_common(1)[0]
    want = {r["id"] for r in subset_rows if (f := eng.graph.facts_of(r["id"])) is not None and f.brand == brand}
    assert len(want) == n
    res = client.post("/v1/search", json={"text": "shirt shoes watch bag", "k": 100,
                                          "filters": {"brand": brand}, "facets": ["brand"]}).json()
    got = set(ids(res))
    assert res["total"] > 0 and got and got <= want  # only that brand's products
    assert [v["value"] for v in res["facets"]["brand"]] == [brand]
    assert res["facets"]["brand"][0]["count"] == res["total"]
    lower = client.post("/v1/search", json={"text": "shirt", "k": 10, "filters": {"brand": brand.lower()}}).json()
    assert lower["total"] > 0 and set(ids(lower)) <= want  # the filter is case-insensitive, like the record's
    res = client.post("/v1/search", json={"text": "shirt shoes", "k": 50, "facets": ["brand"]}).json()
    counted = Counter(eng.graph.facts_of(h["id"]).brand for h in res["results"])
    facet = {v["value"]: v["count"] for v in res["facets"]["brand"]}
    for b, c in counted.items():
        if b:
            assert facet.get(b, 0) >= c
