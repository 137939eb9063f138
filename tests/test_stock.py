"""Stock and partial updates through the HTTP API: PATCH /v1/products/{id} changes price, stock
or attributes without encoding again; out-of-stock products rank last (or hide), per setting
and per rule."""

from __future__ import annotations

import numpy as np
from conftest import engine_and_client

KEY = {"X-API-Key": "stock-key"}
QUERY = "women blue tops"


eng, client = engine_and_client("stock", api_key="stock-key")


def search(client, **body) -> dict:
    r = client.post("/v1/search", json={"text": QUERY, "k": 10, **body})
    assert r.status_code == 200, r.text
    return r.json()


def ids(res: dict) -> list[str]:
    return [h["id"] for h in res["results"]]


def patch(client, pid: str, body: dict, status: int = 200) -> dict:
    r = client.patch(f"/v1/products/{pid}", json=body, headers=KEY)
    assert r.status_code == status, r.text
    return r.json()


def test_patch_keeps_vectors_unless_the_embedded_text_changes(eng, client, subset_rows):
    pid = subset_rows[3]["id"]
    before = eng.records.get(pid, with_vectors=True)
    out = patch(client, pid, {"price": 1234.5, "in_stock": True, "quantity": 7, "attributes": {"season": None}})
    assert out["patched"] and not out["reencoded"]
    after = eng.records.get(pid, with_vectors=True)
    for f in ("fused", "image", "text", "native"):
        a, b = before.vectors[f], after.vectors[f]
        assert (a is None and b is None) or np.array_equal(a, b)
    got = client.get(f"/v1/products/{pid}").json()
    assert got["price"] == 1234.5 and got["attributes"]["quantity"] == 7 and got["attributes"]["in_stock"] is True
    assert "season" not in got["attributes"] and got["attributes"]["gender"] == subset_rows[3]["gender"]
    assert patch(client, pid, {"price": 1234.5})["unchanged"]
    # the new price is what the price filter and sort see at once
    res = client.post("/v1/search", json={"text": got["title"], "filters": {"price_min": 1234, "price_max": 1235}})
    assert ids(res.json()) == [pid]
    out = patch(client, pid, {"title": got["title"] + " Limited Edition"})
    assert out["patched"] and out["reencoded"]
    assert not np.array_equal(eng.records.get(pid, with_vectors=True).vectors["fused"], before.vectors["fused"])


def test_patch_errors(client, subset_rows):
    pid = subset_rows[4]["id"]
    assert client.patch(f"/v1/products/{pid}", json={"price": 1}).status_code == 401
    patch(client, "no-such-product", {"price": 1}, 404)
    r = patch(client, pid, {"price": -3}, 422)
    assert "price" in r["error"]["message"]
    assert "id" in patch(client, pid, {"id": "other"}, 422)["error"]["message"]
    patch(client, pid, {}, 422)


def test_out_of_stock_ranks_last_hides_by_setting_and_rules_override(eng, client):
    base = search(client, k=20, facets=["colour"])
    top = ids(base)[0]
    try:
        patch(client, top, {"in_stock": False})
        res = search(client, k=20, facets=["colour"], explain=True)
        order = ids(res)
        assert order[0] != top and res["total"] == base["total"] and res["facets"] == base["facets"]
        assert order.index(top) == base["total"] - 1  # last of the matching products
        hit = res["results"][order.index(top)]
        assert hit["explanation"]["rules"] == [{"rule": None, "action": "stock", "out_of_stock": "last"}]
        assert "rules" not in hit  # no rule moved it: the setting did
        eng.settings.search.out_of_stock = "hide"
        res = search(client, k=20, facets=["colour"])
        assert top not in ids(res) and res["total"] == base["total"] - 1
        r = client.put("/v1/rules/show-stock", headers=KEY, json={
            "conditions": {"query": {"is": QUERY}}, "consequences": {"out_of_stock": "show"}})
        assert r.status_code == 200, r.text
        assert ids(search(client))[0] == top
        client.delete("/v1/rules/show-stock", headers=KEY)
        eng.settings.search.out_of_stock = "last"
        patch(client, top, {"in_stock": None, "quantity": 0})  # no flag: a quantity of 0 is out of stock
        assert ids(search(client, k=20))[0] != top
        patch(client, top, {"quantity": 3})
        assert ids(search(client))[0] == top
    finally:
        eng.settings.search.out_of_stock = "last"
        patch(client, top, {"in_stock": None, "quantity": None})


def test_stock_values():
    from vitrine.index.stock import is_out_of_stock

    assert is_out_of_stock({"in_stock": False}) and is_out_of_stock({"In_Stock": "no"})
    assert is_out_of_stock({"quantity": 0}) and not is_out_of_stock({"quantity": "4"})
    assert not is_out_of_stock({"in_stock": True, "quantity": 0})  # the flag says
    assert not is_out_of_stock({}) and not is_out_of_stock(None)


def test_patch_events_through_kafka(eng, client, subset_rows, broker, settings_factory, tmp_path):
    """`{"op": "patch", "id", "fields"}` on the catalogue topic: applied by the worker as PATCH is,
    the stored vectors kept; an unknown product goes to the dead letters."""
    from kafka_broker import kafka_settings, unique

    from vitrine.ingest import events
    from vitrine.ingest.kafka.publisher import Publisher
    from vitrine.ingest.kafka.worker import IngestWorker

    stream = {"kafka_bootstrap": broker.bootstrap, "kafka_topic": unique("patch"), "kafka_group": unique("g")}
    s = kafka_settings(settings_factory, tmp_path / "unused", stream)
    pid = subset_rows[9]["id"]
    before = eng.records.get(pid, with_vectors=True)
    key, value = events.encode_event(events.patch(pid, {"price": 777.0, "in_stock": False}))
    assert events.parse_event(key, value).fields == {"price": 777.0, "in_stock": False}
    with Publisher(s) as pub:
        pub.send(events.patch(pid, {"price": 777.0, "in_stock": False}))
        pub.send(events.patch("no-such-product", {"price": 1.0}))
    st = IngestWorker(eng, s).run(until_idle=1.0, timeout=60)
    assert st["applied"]["upserted"] == 1 and st["dlq"] == 1, st
    got = client.get(f"/v1/products/{pid}").json()
    assert got["price"] == 777.0 and got["attributes"]["in_stock"] is False
    assert np.array_equal(eng.records.get(pid, with_vectors=True).vectors["fused"], before.vectors["fused"])
    patch(client, pid, {"in_stock": None})
