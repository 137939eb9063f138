"""Shopping sessions through the HTTP API (FastAPI TestClient over the small real subset engine)."""

from __future__ import annotations

import base64
from collections import Counter

from conftest import SOURCE, new_sid as sid, search10 as search
from vitrine.conversation.stage import SessionStage




def attrs(hit):
    return hit.get("attributes") or {}


def common(subset_rows, n=8):
    """An (articleType, gender) of the subset with products in at least two colours."""
    c = Counter((r["articleType"], r["gender"]) for r in subset_rows)
    for (t, g), m in c.most_common():
        colours = Counter(r["baseColour"] for r in subset_rows if r["articleType"] == t and r["gender"] == g)
        if m >= n and len(colours) >= 2:
            return t, g, [col for col, _ in colours.most_common()]
    raise AssertionError("no common type")


def test_refinement_changes_colour_and_keeps_the_rest(client, subset_rows):
    t, g, colours = common(subset_rows)
    s = sid()
    first = search(client, text=f"{g.lower()} {t.lower()}", session=s)
    assert first["session"]["new_search"] is True and first["session"]["turn"] == 1
    second = search(client, text=f"in {colours[1].lower()}", session=s)
    sess = second["session"]
    assert sess["new_search"] is False and 0.5 <= sess["p_refine"] <= 1 and "colour" in sess["changed"]
    assert sess["filters"]["colour"] == colours[1] and sess["filters"]["gender"] == g
    assert second["results"]
    for h in second["results"]:
        assert attrs(h)["colour"] == colours[1] and attrs(h)["gender"] == g
    keys = {c["key"] for c in sess["chips"]}
    assert f"colour:{colours[1]}" in keys and f"gender:{g}" in keys
    # standalone, "in <colour>" knows nothing of the type
    alone = search(client, text=f"in {colours[1].lower()}")
    assert "session" not in alone


def test_exclusion_english_and_chinese(client, subset_rows):
    t, g, colours = common(subset_rows)
    s = sid()
    search(client, text=f"{g.lower()} {t.lower()}", session=s)
    out = search(client, text=f"not {colours[0].lower()}", session=s)
    assert out["session"]["new_search"] is False
    assert out["session"]["filters"]["exclude"] == {"colour": [colours[0]]}
    assert all(attrs(h).get("colour") != colours[0] for h in out["results"])
    # Chinese: 不要 + the lexicon's surface form of a catalogue colour
    s2 = sid()
    search(client, text=f"{g.lower()} {t.lower()}", session=s2)
    out = search(client, text="不要黑色", session=s2)
    assert out["session"]["new_search"] is False
    assert out["session"]["filters"].get("exclude", {}).get("colour") == ["Black"]
    assert all(attrs(h).get("colour") != "Black" for h in out["results"])


def test_chinese_attribute_change(client, subset_rows):
    t, _, _ = common(subset_rows)
    s = sid()
    search(client, text=f"{t.lower()}", session=s)
    out = search(client, text="要男士的", session=s)
    assert out["session"]["new_search"] is False and out["session"]["filters"]["gender"] == "Men"
    assert all(attrs(h)["gender"] == "Men" for h in out["results"])


def test_new_search_is_read_as_one_and_can_be_forced(client, subset_rows):
    t, g, _ = common(subset_rows)
    s = sid()
    search(client, text=f"{g.lower()} {t.lower()}", session=s)
    other = next(r["articleType"] for r in subset_rows if r["articleType"] != t)
    out = search(client, text=other.lower(), session=s)
    assert out["session"]["new_search"] is True and out["session"]["p_new_search"] > 0.5
    forced = search(client, text="in blue", session=s, new_search=True)
    assert forced["session"]["new_search"] is True and forced["session"]["decided_by"] == "client"


def test_references_to_what_was_shown(client, subset_rows):
    t, g, _ = common(subset_rows)
    s = sid()
    first = search(client, text=f"{g.lower()} {t.lower()}", session=s)
    shown = [h["id"] for h in first["results"]]
    like = search(client, text="more like the second one", session=s)
    assert like["session"]["new_search"] is False and like["session"]["reference"]["ids"] == [shown[1]]
    assert like["session"]["image"] is True and like["results"]
    s2 = sid()
    first = search(client, text=f"{g.lower()} {t.lower()}", session=s2)
    shown = [h["id"] for h in first["results"]]
    cmp = search(client, text="compare the first two", session=s2)
    assert cmp["session"]["reference"] == {"ids": shown[:2], "action": "compare"}
    assert [p["id"] for p in cmp["compare"]["products"]] == shown[:2]


def test_pages_keep_the_session_and_chips_are_removable(client, subset_rows):
    t, g, colours = common(subset_rows)
    s = sid()
    search(client, text=f"{g.lower()} {t.lower()}", session=s)
    ref = search(client, text=f"in {colours[0].lower()}", session=s, k=3)
    page2 = search(client, text=f"in {colours[0].lower()}", session=s, k=3, offset=3)
    assert page2["session"]["decided_by"] == "same_query" and page2["session"]["filters"] == ref["session"]["filters"]
    assert not {h["id"] for h in ref["results"]} & {h["id"] for h in page2["results"]}
    dropped = search(client, session=s, session_drop=[f"colour:{colours[0]}"])
    assert "colour" not in dropped["session"]["filters"] and "colour" in dropped["session"]["changed"]
    assert dropped["session"]["filters"]["gender"] == g


def test_photo_session_then_words(client, subset_rows):
    t, g, colours = common(subset_rows)
    row = next(r for r in subset_rows if r["articleType"] == t and r["gender"] == g)
    photo = base64.b64encode((SOURCE / "images" / f"{row['id']}.jpg").read_bytes()).decode()
    s = sid()
    first = search(client, image_b64=photo, session=s)
    assert first["session"]["image"] is True
    out = search(client, text=f"in {colours[1].lower()}", session=s)
    assert out["session"]["new_search"] is False and out["session"]["image"] is True
    assert out["session"]["filters"]["colour"] == colours[1]
    assert all(attrs(h)["colour"] == colours[1] for h in out["results"])
    # a photo dropped mid-session keeps the words' slots
    s2 = sid()
    search(client, text=f"{g.lower()} {t.lower()}", session=s2)
    search(client, text=f"in {colours[1].lower()}", session=s2)
    files = {"file": ("p.jpg", (SOURCE / "images" / f"{row['id']}.jpg").read_bytes(), "image/jpeg")}
    r = client.post("/v1/search/image", files=files, data={"k": "10", "session": s2})
    assert r.status_code == 200, r.text
    sess = r.json()["session"]
    assert sess["image"] is True and sess["filters"].get("colour") == colours[1]


def test_unknown_or_expired_session_is_a_new_search_and_bad_ids_are_422(client, engine):
    out = search(client, text="shoes", session=sid())
    assert out["session"]["new_search"] is True and out["session"]["decided_by"] == "new_session"
    assert client.post("/v1/search", json={"text": "shoes", "session": "x" * 129}).status_code == 422
    assert client.post("/v1/search", json={"text": "shoes", "session": "a\x01b"}).status_code == 422
    s = sid()
    search(client, text="shoes", session=s)
    store = engine.stage(SessionStage).sessions.store
    old = store.ttl_s
    store.ttl_s = 0.0
    try:
        out = search(client, text="in black", session=s)
    finally:
        store.ttl_s = old
    assert out["session"]["decided_by"] == "expired" and out["session"]["new_search"] is True


def test_sessions_live_in_the_data_dir_for_other_workers(engine, subset_rows):
    from vitrine.conversation.store import SessionStore

    store = engine.stage(SessionStage).sessions.store
    assert isinstance(store, SessionStore)
    other = SessionStore(store.path, ttl_s=60, max_sessions=10)  # another process's view
    s = sid()
    from vitrine.search.models import SearchRequest

    engine.search(SearchRequest(text="black shoes", session=s))
    got = other.get(s)
    assert got is not None and got.state["turn"] == 1
    for i in range(15):
        other.put(f"bulk-{i}", {"turn": 1}, None)
    other.purge()
    assert other.count() <= 10
    other.close()


def test_price_refinements_relative_to_what_was_shown(fresh_engine):
    """A priced catalogue (the bundled one has no prices): "cheaper", "under N", "便宜一点的"."""
    from vitrine.search.writes import ProductInput
    from vitrine.search.models import Product, SearchRequest

    colours = ["Black", "Brown", "White"]
    items = [ProductInput(Product(id=f"p{i}", title=f"{colours[i % 3]} leather sofa model {i}",
                                  category="Furniture > Living Room > Sofas",
                                  attributes={"colour": colours[i % 3]}, price=500.0 + 100 * i))
             for i in range(24)]
    items += [ProductInput(Product(id=f"l{i}", title=f"desk lamp {i}", category="Lighting > Lamps",
                                   attributes={"colour": "White"}, price=50.0 + i)) for i in range(6)]
    assert fresh_engine.upsert(items).upserted == 30
    s = sid()

    def go(text):
        return fresh_engine.search(SearchRequest(text=text, k=10, session=s)).model_dump(exclude_none=True)

    first = go("leather sofas")
    shown = sorted(h["price"] for h in first["results"])
    cheaper = go("cheaper")
    assert cheaper["session"]["new_search"] is False and "price_max" in cheaper["session"]["changed"]
    bound = cheaper["session"]["filters"]["price_max"]
    assert bound < shown[len(shown) // 2] + 1e-6
    assert cheaper["results"] and all(h["price"] <= bound for h in cheaper["results"])
    assert all("Sofas" in h["category"] for h in cheaper["results"])
    under = go("under 1000")
    assert under["session"]["filters"]["price_max"] == 1000
    assert all(h["price"] <= 1000 for h in under["results"])
    s2 = sid()
    fresh_engine.search(SearchRequest(text="leather sofas", k=10, session=s2))
    zh = fresh_engine.search(SearchRequest(text="便宜一点的", k=10, session=s2)).model_dump(exclude_none=True)
    assert zh["session"]["new_search"] is False and zh["session"]["filters"].get("price_max") is not None


def test_multipart_photo_search_takes_new_search(client, subset_rows):
    row = subset_rows[5]
    s = sid()
    search(client, text="black shoes", session=s)
    files = {"file": ("p.jpg", (SOURCE / "images" / f"{row['id']}.jpg").read_bytes(), "image/jpeg")}
    r = client.post("/v1/search/image", files=files, data={"k": "5", "session": s, "new_search": "true"})
    assert r.status_code == 200, r.text
    assert r.json()["session"]["new_search"] is True and r.json()["session"]["decided_by"] == "client"
    bad = client.post("/v1/search/image", files=files, data={"session": "x" * 200})
    assert bad.status_code == 422


def test_the_same_request_again_gives_the_same_results(client, subset_rows):
    """A page, a reload or a second look at a new search runs it as it ran (soft slot filters and all)."""
    s = sid()
    body = {"text": "men shoes", "k": 24, "explain": True, "facets": ["gender", "colour"], "session": s}
    first = search(client, **body)
    again = search(client, **body)
    assert again["session"]["decided_by"] == "same_query" and again["session"]["turn"] == first["session"]["turn"]
    assert [h["id"] for h in again["results"]] == [h["id"] for h in first["results"]]
    plain = search(client, **{k: v for k, v in body.items() if k != "session"})
    assert [h["id"] for h in plain["results"]] == [h["id"] for h in first["results"]]
    row = subset_rows[7]
    photo = base64.b64encode((SOURCE / "images" / f"{row['id']}.jpg").read_bytes()).decode()
    p1 = search(client, image_b64=photo, session=s, k=5)
    p2 = search(client, image_b64=photo, session=s, k=5, offset=5)
    assert p2["session"]["decided_by"] == "same_query"
    assert not {h["id"] for h in p1["results"]} & {h["id"] for h in p2["results"]}


def test_a_price_in_a_catalogue_without_prices_filters_nothing(client, subset_rows):
    t, g, _ = common(subset_rows)
    s = sid()
    search(client, text=f"{g.lower()} {t.lower()}", session=s)
    out = search(client, text="under 2000", session=s)
    assert out["session"]["new_search"] is False and out["results"]
    assert "price_max" not in out["session"]["filters"] and out["session"]["notes"]


def test_a_session_facet_count_is_what_applying_it_gives(client, subset_rows):
    t, _, colours = common(subset_rows)
    s = sid()
    search(client, text=t.lower(), session=s)
    base = search(client, text=f"not {colours[0].lower()}", session=s, facets=["gender", "colour"])
    assert base["session"]["new_search"] is False
    tried = 0
    for f in ("gender", "colour"):
        for fv in base["facets"][f][:5]:
            got = search(client, text=f"not {colours[0].lower()}", session=s, filters={f: fv["value"]})
            assert got["session"]["new_search"] is False
            assert got["total"] == fv["count"], (f, fv, got["total"])
            tried += 1
    assert tried >= 3
