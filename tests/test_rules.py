"""Merchandising rules through the HTTP API (FastAPI TestClient, real models, the subset catalogue
in a data dir of this module's own): each consequence with paging, sorts and facets, bad rules
answered 422 naming the field, rules that never break a search."""

from __future__ import annotations

import time

import pytest
from conftest import engine_and_client

KEY = {"X-API-Key": "rules-key"}
QUERY = "men black shoes"


eng, client = engine_and_client("rules", api_key="rules-key")


@pytest.fixture(autouse=True)
def no_rules_left(client):
    yield
    for r in client.get("/v1/rules", headers=KEY).json():
        client.delete(f"/v1/rules/{r['id']}", headers=KEY)


def put(client, rid: str, body: dict, status: int = 200) -> dict:
    r = client.put(f"/v1/rules/{rid}", json=body, headers=KEY)
    assert r.status_code == status, r.text
    return r.json()


def search(client, **body) -> dict:
    r = client.post("/v1/search", json={"text": QUERY, "k": 10, **body})
    assert r.status_code == 200, r.text
    return r.json()


def ids(res: dict) -> list[str]:
    return [h["id"] for h in res["results"]]


def all_pages(client, k: int = 10, pages: int = 4, **body) -> list[str]:
    out: list[str] = []
    for n in range(pages):
        out += ids(search(client, k=k, offset=n * k, **body))
    return out


def outsider(client, res: dict, subset_rows) -> str:
    """A product of the subset that the query does not rank in its first 40."""
    seen = set(all_pages(client))
    return next(r["id"] for r in subset_rows if r["id"] not in seen and r["masterCategory"] != "Footwear")


# -- the contract --------------------------------------------------------------------------------------
def test_pin_at_position_zero_for_an_exact_query(client, subset_rows):
    base = search(client)
    pid = outsider(client, base, subset_rows)
    out = put(client, "shoes-pin", {"conditions": {"query": {"is": QUERY}},
                                    "consequences": {"pin": [{"id": pid, "position": 0}]}, "enabled": True})
    assert out["id"] == "shoes-pin" and out["active"] and out["conditions"]["query"] == {"is": QUERY}
    for text in (QUERY, "Men,  BLACK shoes!", "  men black   shoes "):  # normalised words
        res = search(client, text=text)
        assert res["results"][0]["id"] == pid and res["rules"] == ["shoes-pin"]
        assert res["results"][0]["rules"] == ["shoes-pin"]
        assert all("rules" not in h for h in res["results"][1:])  # only the hit a rule moved names it
        if text == QUERY:
            assert ids(res)[1:] == ids(base)[:9]  # the rest shifted by one
    res = search(client, explain=True)
    assert res["results"][0]["explanation"]["rules"] == [{"rule": "shoes-pin", "action": "pin", "position": 0}]
    other = search(client, text=QUERY + " for running")  # not the exact query
    assert pid not in ids(other) and other["rules"] == []


def test_pin_counts_once_on_every_page_and_in_facets(client, subset_rows):
    base = search(client, facets=["colour"])
    inside = ids(base)[1]  # a product already matching: pinned to position 7 it must not count twice
    put(client, "p7", {"conditions": {"query": {"is": QUERY}},
                       "consequences": {"pin": [{"id": inside, "position": 7}]}})
    pages = all_pages(client, k=5, pages=6)
    assert pages.index(inside) == 7 and pages.count(inside) == 1 and len(set(pages)) == len(pages)
    res = search(client, facets=["colour"])
    assert res["total"] == base["total"]
    assert res["facets"]["colour"] == base["facets"]["colour"]
    page2 = search(client, k=5, offset=5)
    assert ids(page2)[2] == inside and page2["results"][2]["rules"] == ["p7"]
    # a product the query does not match, pinned: counted once more, on its page
    out = outsider(client, base, subset_rows)
    put(client, "p7", {"conditions": {"query": {"is": QUERY}},
                       "consequences": {"pin": [{"id": inside, "position": 7}, {"id": out, "position": 2}]}})
    res = search(client, facets=["colour"])
    assert res["total"] == base["total"] + 1 and ids(res)[2] == out
    assert sum(f["count"] for f in res["facets"]["colour"]) == sum(f["count"] for f in base["facets"]["colour"]) + 1
    pages = all_pages(client, k=5, pages=6)
    assert pages.count(out) == 1 and pages.index(inside) == 7
    for sort in ("price_asc", "newest"):  # sorted orders hold it once too (sorted among the matching)
        assert all_pages(client, k=5, pages=6, sort=sort).count(out) == 1


def test_hide_is_absent_from_pages_sorts_facets_and_totals(client):
    base = search(client, facets=["colour"])
    gone = base["results"][0]
    colour = gone["attributes"]["colour"]
    put(client, "recall", {"consequences": {"hide": [gone["id"]]}})  # no condition: every search
    for sort in ("relevance", "price_asc", "price_desc", "newest"):
        assert gone["id"] not in all_pages(client, sort=sort)
    res = search(client, facets=["colour"])
    assert res["total"] == base["total"] - 1 and res["rules"] == ["recall"]
    before = {f["value"]: f["count"] for f in base["facets"]["colour"]}
    after = {f["value"]: f["count"] for f in res["facets"]["colour"]}
    assert after.get(colour, 0) == before[colour] - 1
    # other queries too
    assert gone["id"] not in ids(search(client, text=gone["title"]))


def brand_of(eng, hit: dict) -> str | None:
    """The brand the product graph holds for a hit (the subset has no brand field: learned from the
    titles, whatever their case: "FILA Men FILA Runner ..." is Fila's), read from the graph's facts,
    not through the filter index the rules use."""
    facts = eng.graph.facts_of(hit["id"])
    return facts.brand if facts is not None else None


def test_brand_boost_moves_that_brand_up_and_bury_down(eng, client):
    base = search(client, k=30, explain=True)
    brands = [brand_of(eng, h) for h in base["results"]]
    top = brands[0]
    assert top is not None
    target = max((b for b in set(brands) if b and b != top), key=brands.index)  # the lowest-ranked brand
    put(client, "boost", {"conditions": {"query": {"contains": "shoes"}},
                          "consequences": {"boost": [{"filter": {"brand": target}, "weight": 0.5}]}})
    res = search(client, k=30, explain=True)
    n = brands.count(target)
    assert [brand_of(eng, h) for h in res["results"][:n]] == [target] * n
    assert res["rules"] == ["boost"]
    moved = [h for h in res["results"] if brand_of(eng, h) == target]
    assert all(h["rules"] == ["boost"] for h in moved)
    assert moved[0]["explanation"]["rules"][0] == {"rule": "boost", "action": "boost", "weight": 0.5}
    assert all("rules" not in h for h in res["results"] if brand_of(eng, h) != target)
    assert len(set(all_pages(client, k=10, pages=3))) == 30  # pages neither overlap nor skip
    put(client, "boost", {"conditions": {"query": {"contains": "shoes"}},
                          "consequences": {"bury": [{"filter": {"brand": top}, "weight": 5}]}})
    res = search(client, k=30)
    last = [brand_of(eng, h) == top for h in res["results"]]
    assert not last[0] and last == sorted(last)  # that brand after every other one


def test_colour_boost(client):
    base = search(client, k=20)
    colours = [h["attributes"].get("colour") for h in base["results"]]
    target = max((c for c in set(colours) if c and c != colours[0]), key=colours.index)
    put(client, "colour", {"consequences": {"boost": [{"filter": {"colour": target}, "weight": 1}]}})
    res = search(client, k=20)
    assert res["results"][0]["attributes"].get("colour") == target


def test_filters_banner_and_redirect(client):
    put(client, "women", {"conditions": {"query": {"contains": "black shoes"}},
                          "consequences": {"filters": {"gender": "Women"}, "banner": {"text": "Women's week"},
                                           "redirect": "/campaigns/women"}})
    res = search(client, facets=["gender"])
    assert res["results"] and all(h["attributes"].get("gender") == "Women" for h in res["results"])
    assert [f["value"] for f in res["facets"]["gender"]] == ["Women"]
    assert res["banner"] == {"text": "Women's week"} and res["redirect"] == "/campaigns/women"
    assert search(client, text="black shoe polish")["rules"] == []  # "black shoes" is not in it


def test_contains_matches_words_in_order_and_chinese_substrings(client):
    put(client, "c", {"conditions": {"query": {"contains": "Black Shoes"}}, "consequences": {"banner": {"b": 1}}})
    assert search(client, text="men's black-shoes, size 9")["rules"] == ["c"]
    assert search(client, text="shoes black")["rules"] == []
    assert search(client, text="blackshoes")["rules"] == []
    put(client, "zh", {"conditions": {"query": {"contains": "连衣裙"}}, "consequences": {"banner": {"zh": True}}})
    assert search(client, text="夏季 连衣裙 红色")["rules"] == ["zh"]
    assert search(client, text="连衣")["rules"] == []
    put(client, "zh-is", {"conditions": {"query": {"is": "夏季 连衣裙"}}, "consequences": {"banner": {"x": 1}}})
    assert search(client, text="夏季连衣裙")["rules"] == ["zh-is"]  # exact rules first: zh's banner is taken, it changed nothing


def test_campaign_dates_category_and_intent(client):
    now = time.time()
    put(client, "past", {"conditions": {"from": now - 7200, "until": now - 3600},
                         "consequences": {"banner": {"t": "past"}}})
    put(client, "future", {"conditions": {"from": "2999-01-01T00:00:00Z"}, "consequences": {"banner": {"t": "f"}}})
    put(client, "now", {"conditions": {"from": now - 60, "until": now + 3600},
                        "consequences": {"banner": {"t": "now"}}})
    res = search(client)
    assert res["rules"] == ["now"] and res["banner"] == {"t": "now"}
    listed = {r["id"]: r["active"] for r in client.get("/v1/rules", headers=KEY).json()}
    assert listed == {"past": False, "future": False, "now": True}
    put(client, "cat", {"conditions": {"category": "Footwear"}, "consequences": {"banner": {"t": "cat"}}})
    assert "cat" not in search(client)["rules"]
    assert "cat" in search(client, filters={"category": "footwear"})["rules"]
    put(client, "intent", {"conditions": {"intent": "search"}, "consequences": {"banner": {"t": "i"}}})
    assert "intent" in search(client)["rules"]
    assert "intent" not in search(client, use_intent=False)["rules"]


def test_a_variant_rule_applies_only_in_its_variant(eng, client):
    from vitrine.search.models import SearchRequest

    put(client, "variant-b", {"conditions": {"variant": "B"}, "consequences": {"banner": {"v": "B"}}})
    assert search(client)["rules"] == []
    book, req = eng.rules, SearchRequest(text=QUERY)
    assert book.apply(eng.reader, req, QUERY, None, [], variant="B").fired == ["variant-b"]
    assert book.apply(eng.reader, req, QUERY, None, [], variant="A").fired == []


def test_disabled_rules_do_nothing(client):
    put(client, "off", {"consequences": {"banner": {"x": 1}}, "enabled": False})
    assert search(client)["rules"] == []
    assert client.get("/v1/rules/off", headers=KEY).json()["enabled"] is False


# -- managing rules ------------------------------------------------------------------------------------
def test_rules_crud_and_the_key(client):
    body = {"conditions": {"query": {"is": "x"}}, "consequences": {"hide": ["1"]}}
    assert client.put("/v1/rules/a", json=body).status_code == 401
    assert client.put("/v1/rules/a", json=body, headers={"X-API-Key": "wrong"}).status_code == 401
    put(client, "a", body)
    got = client.get("/v1/rules/a", headers=KEY).json()
    assert got["consequences"]["hide"] == ["1"] and got["enabled"] is True and "updated" in got
    assert [r["id"] for r in client.get("/v1/rules", headers=KEY).json()] == ["a"]
    assert client.delete("/v1/rules/a").status_code == 401
    assert client.delete("/v1/rules/a", headers=KEY).status_code == 200
    assert client.get("/v1/rules/a", headers=KEY).status_code == 404
    assert client.delete("/v1/rules/a", headers=KEY).status_code == 404


@pytest.mark.parametrize("body,field", [
    ({"consequences": {"pin": [{"id": "no-such-product", "position": 0}]}}, "consequences.pin[0].id"),
    ({"consequences": {"pin": [{"id": "{pid}", "position": 100}]}}, "consequences.pin[0].position"),
    ({"consequences": {"boost": [{"filter": {"flavour": "x"}, "weight": 1}]}}, "consequences.boost.0.filter.flavour"),
    ({"consequences": {"filters": {"size": "M"}}}, "consequences.filters.size"),
    ({"conditions": {"from": "2026-02-01T00:00:00Z", "until": "2026-01-01T00:00:00Z"},
      "consequences": {"hide": ["1"]}}, "conditions.until"),
    ({"conditions": {"query": {"is": "a", "contains": "b"}}, "consequences": {"hide": ["1"]}}, "conditions.query"),
    ({"conditions": {"query": {"is": "!!"}}, "consequences": {"hide": ["1"]}}, "conditions.query"),
    ({"consequences": {"redirect": "javascript:alert(1)"}}, "consequences.redirect"),
    ({"conditions": {"intent": "shopping"}, "consequences": {"hide": ["1"]}}, "conditions.intent"),
    ({"consequences": {"hide": ["1"]}, "colour": "red"}, "colour"),
])
def test_bad_rules_get_a_422_naming_the_field(client, subset_rows, body, field):
    if body["consequences"].get("pin"):
        for p in body["consequences"]["pin"]:
            p["id"] = p["id"].replace("{pid}", subset_rows[0]["id"])
    r = client.put("/v1/rules/bad", json=body, headers=KEY)
    assert r.status_code == 422, r.text
    assert field in r.json()["error"]["message"], r.json()
    assert client.get("/v1/rules/bad", headers=KEY).status_code == 404


def test_more_rules_than_configured_is_a_422(eng, client):
    old = eng.settings.search.max_rules
    eng.settings.search.max_rules = 2
    try:
        put(client, "r1", {"consequences": {"banner": {}}})
        put(client, "r2", {"consequences": {"banner": {}}})
        put(client, "r2", {"consequences": {"banner": {"again": 1}}})  # a replacement fits
        r = client.put("/v1/rules/r3", json={"consequences": {"banner": {}}}, headers=KEY)
        assert r.status_code == 422 and "rules" in r.json()["error"]["message"]
    finally:
        eng.settings.search.max_rules = old


def test_a_rule_that_cannot_be_read_is_skipped_not_fatal(eng, client, caplog):
    eng.rules.store.put("broken", {"consequences": {"pin": "not a list"}}, True)
    put(client, "fine", {"consequences": {"banner": {"ok": 1}}})
    res = search(client)
    assert res["rules"] == ["fine"] and len(res["results"]) == 10
    assert "broken" in eng.rules.broken
    assert client.delete("/v1/rules/broken", headers=KEY).status_code == 200  # deletable by id all the same


def test_another_process_sees_a_change_within_the_refresh_interval(eng, client):
    """A second rule book over the same store, as another worker process has."""
    from vitrine.merchandising.store import open_rule_store
    from vitrine.search.models import SearchRequest
    from vitrine.merchandising.rules import RuleBook

    other = RuleBook(open_rule_store(None, eng.settings.storage.data_dir), eng.index, eng.settings.search)
    req = SearchRequest(text=QUERY)
    assert other.apply(eng.reader, req, QUERY, None, []).fired == []
    put(client, "seen", {"conditions": {"query": {"is": QUERY}}, "consequences": {"banner": {"x": 1}}})
    t0 = time.monotonic()
    while other.apply(eng.reader, req, QUERY, None, []).fired != ["seen"]:
        assert time.monotonic() - t0 < 1.0, "not seen within 1 s"
        time.sleep(0.02)
    client.delete("/v1/rules/seen", headers=KEY)
    time.sleep(eng.settings.search.rules_refresh_s + 0.05)
    assert other.apply(eng.reader, req, QUERY, None, []).fired == []
    other.store.close()


def test_normalise():
    from vitrine.merchandising.models import normalise

    assert normalise("  Summer-DRESS!! ") == "summer dress"
    assert normalise("夏季 连衣裙") == normalise("夏季连衣裙") == "夏季连衣裙"
    assert normalise("ＮＩＫＥ  Shoes") == "nike shoes"


def test_cli_rules_put_list_export_import_delete(eng, client, subset_rows, tmp_path):
    """`vitrine rules` on the data dir the API serves: a put there applies to the API's searches."""
    import json

    from click.testing import CliRunner

    from vitrine.cli.app import main

    data = str(eng.settings.storage.data_dir)
    run = CliRunner().invoke
    pid = subset_rows[7]["id"]
    rule = {"conditions": {"query": {"is": QUERY}}, "consequences": {"pin": [{"id": pid, "position": 0}]}}
    r = run(main, ["rules", "put", "--data", data, "cli-pin", json.dumps(rule)])
    assert r.exit_code == 0, r.output
    t0 = time.monotonic()
    while ids(search(client))[0] != pid:
        assert time.monotonic() - t0 < 1.0
        time.sleep(0.05)
    listed = run(main, ["rules", "list", "--data", data])
    assert [json.loads(line)["id"] for line in listed.stdout.splitlines()] == ["cli-pin"], listed.output
    out = tmp_path / "rules.jsonl"
    assert run(main, ["rules", "export", "--data", data, "--out", str(out)]).exit_code == 0
    assert run(main, ["rules", "delete", "--data", data, "cli-pin"]).exit_code == 0
    assert run(main, ["rules", "delete", "--data", data, "cli-pin"]).exit_code == 2
    assert json.loads(run(main, ["rules", "import", "--data", data, str(out)]).output) == {"imported": 1}
    bad = run(main, ["rules", "put", "--data", data, "x", '{"consequences": {"pin": [{"id": "nope"}]}}'])
    assert bad.exit_code == 2 and "consequences.pin[0].id" in bad.output
