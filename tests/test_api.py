"""The HTTP API over the session engine (FastAPI TestClient, real models)."""

from __future__ import annotations

import base64
import io

import pytest
from fastapi.testclient import TestClient
from PIL import Image

from conftest import SOURCE


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


def b64(pid: str) -> str:
    return base64.b64encode((SOURCE / "images" / f"{pid}.jpg").read_bytes()).decode()


def test_search_text(client):
    r = client.post("/search", json={"text": "men black shoes", "k": 5, "explain": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(body["results"]) == 5 and body["took_ms"] > 0
    hit = body["results"][0]
    assert {"id", "score", "title", "image_url", "explanation"} <= set(hit)
    assert client.get(hit["image_url"]).headers["content-type"] == "image/jpeg"


def test_search_photo_json_and_multipart(client, subset_rows):
    pid = subset_rows[20]["id"]
    r = client.post("/search", json={"image_b64": b64(pid), "k": 3})
    assert r.status_code == 200 and r.json()["results"][0]["id"] == pid
    files = {"file": ("p.jpg", (SOURCE / "images" / f"{pid}.jpg").read_bytes(), "image/jpeg")}
    r = client.post("/search/image", files=files, data={"k": "3", "filters": '{"gender": "%s"}' %
                                                        subset_rows[20]["gender"]})
    assert r.status_code == 200, r.text
    assert r.json()["results"][0]["id"] == pid


def test_products_and_404(client, subset_rows):
    pid = subset_rows[0]["id"]
    r = client.get(f"/products/{pid}")
    assert r.status_code == 200 and r.json()["title"] == subset_rows[0]["productDisplayName"]
    r = client.get("/products/does-not-exist")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    assert client.get("/images/nope.jpg").status_code == 404


@pytest.mark.parametrize("body,status,needle", [
    ({"image_b64": "%%%not-base64"}, 422, "base64"),
    ({"image_b64": base64.b64encode(b"these are not pixels").decode()}, 422, "image"),
    ({"text": "shoe", "k": 0}, 422, "k"),
    ({"text": "shoe", "k": 100000}, 422, "k must be"),
    ({"text": "shoe", "filters": {"flavour": "sweet"}}, 422, "flavour"),
    ({"text": "   "}, 422, "empty query"),
    ({}, 422, "empty query"),
    ({"text": "shoe", "filters": {"price_min": 10, "price_max": 1}}, 422, "price_min"),
])
def test_bad_input_is_a_clear_4xx(client, body, status, needle):
    r = client.post("/search", json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert needle in err["message"] and err["status"] == status


def test_oversized_image_and_body(client, engine):
    big = io.BytesIO()
    Image.new("RGB", (1500, 1000), (10, 200, 30)).save(big, "PNG")
    limit = engine.settings.encoders.max_image_bytes
    assert len(big.getvalue()) < limit  # under the byte limit: the pixel limit applies
    engine.settings.encoders.max_image_pixels, old = 1_000_000, engine.settings.encoders.max_image_pixels
    engine.encoder.max_image_pixels = 1_000_000
    try:
        r = client.post("/search", json={"image_b64": base64.b64encode(big.getvalue()).decode()})
        assert r.status_code == 413 and "pixels" in r.json()["error"]["message"]
    finally:
        engine.settings.encoders.max_image_pixels = engine.encoder.max_image_pixels = old
    r = client.post("/search", content=b"x" * (engine.settings.web.max_body_bytes + 10),
                    headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "too_large"


def test_upload_that_is_not_an_image(client):
    r = client.post("/search/image", files={"file": ("a.txt", b"hello", "text/plain")})
    assert r.status_code == 422 and "content type" in r.json()["error"]["message"]
    r = client.post("/search/image", files={"file": ("a.jpg", b"hello", "image/jpeg")})
    assert r.status_code == 422 and "image" in r.json()["error"]["message"]


def test_health_and_metrics(client):
    h = client.get("/health").json()
    assert h["status"] == "ok" and h["products"] > 0
    client.post("/search", json={"text": "watch"})
    m = client.get("/metrics")
    assert m.status_code == 200 and "text/plain" in m.headers["content-type"]
    assert 'vitrine_searches_total{modality="text"}' in m.text
    assert "vitrine_http_request_seconds_bucket" in m.text and "vitrine_products " in m.text


def test_writes_need_the_api_key(write_client, subset_rows):
    r0 = subset_rows[0]
    prod = {"id": "w1", "title": r0["productDisplayName"], "image_b64": b64(r0["id"]),
            "attributes": {"gender": r0["gender"]}}
    assert write_client.put("/products/w1", json=prod).status_code == 401
    assert write_client.put("/products/w1", json=prod, headers={"X-API-Key": "wrong"}).status_code == 401
    r = write_client.put("/products/w1", json=prod, headers={"X-API-Key": "s3cret"})
    assert r.status_code == 200 and r.json()["upserted"] == 1, r.text
    assert write_client.put("/products/other", json=prod, headers={"X-API-Key": "s3cret"}).status_code == 422
    assert write_client.get("/products/w1").status_code == 200
    assert write_client.delete("/products/w1").status_code == 401
    assert write_client.delete("/products/w1", headers={"X-API-Key": "s3cret"}).status_code == 200
    assert write_client.get("/products/w1").status_code == 404
    assert write_client.delete("/products/w1", headers={"X-API-Key": "s3cret"}).status_code == 404


def test_openapi_lists_the_endpoints(client):
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/v1/search", "/v1/search/image", "/v1/products/{pid}", "/v1/health", "/v1/metrics"} <= set(paths)


def test_search_concurrency_lets_that_many_searches_run_at_once(fresh_engine):
    """``search_concurrency``: at most that many searches of one process run at once (JSON and
    multipart photo searches alike); the others wait their turn and all are answered."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from vitrine.search.models import SearchResponse
    from vitrine.web.app import create_app

    fresh_engine.settings.web.search_concurrency = 2
    state = {"now": 0, "most": 0}
    lock = threading.Lock()

    def search(req, image=None, log_search=False, client=None):  # a slow stand-in that counts who is inside
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
        time.sleep(0.05)
        with lock:
            state["now"] -= 1
        return SearchResponse(results=[], took_ms=50.0, k=req.k, query={"text": req.text}, model="m", degraded=[])

    fresh_engine.search = search
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 0, 0)).save(buf, format="PNG")
    with TestClient(create_app(engine=fresh_engine)) as c:
        def one(i: int) -> int:
            if i % 2:
                return c.post("/search/image", files={"file": ("p.png", buf.getvalue(), "image/png")}).status_code
            return c.post("/search", json={"text": f"red shoes {i}"}).status_code

        with ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(one, range(16)))
    assert codes == [200] * 16
    assert state["most"] == 2
