"""vitrine.client, sync and async, against real servers: the app over the session engine served by
uvicorn, a server that starts late (connection errors), and a server answering 503 or too slowly."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from conftest import SOURCE, copy_data_dir
from vitrine.client import ApiError, AsyncClient, Client, RetryPolicy, Unreachable
from vitrine.search.models import ProductOut, SearchResponse


@contextmanager
def serving(app, sock: socket.socket | None = None, delay_s: float = 0.0) -> Iterator[str]:
    """``app`` served by uvicorn on a free port (after ``delay_s``: connections are refused until then)."""
    import uvicorn

    if sock is None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))

    def run() -> None:
        time.sleep(delay_s)
        server.run(sockets=[sock])

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    if not delay_s:
        deadline = time.time() + 600  # the lifespan warms the engine up first (slow on a busy machine)
        while not server.started:
            assert thread.is_alive() and time.time() < deadline, "uvicorn did not start"
            time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()


@pytest.fixture(scope="module")
def url(engine):
    from vitrine.web.app import create_app

    with serving(create_app(engine=engine)) as u:
        Client(u).wait_ready(60)
        yield u


def test_sync_client_is_typed_by_the_api_models(url, subset_rows):
    with Client(url) as vc:
        page = vc.search("men black shoes", k=5, facets=["gender"], highlight=True, use_intent=False)
        assert isinstance(page, SearchResponse) and len(page.results) == 5
        assert page.facets and page.facets["gender"] and page.total and page.pool
        nxt = vc.search("men black shoes", k=5, offset=5, use_intent=False)
        assert not {h.id for h in nxt.results} & {h.id for h in page.results}
        pid = subset_rows[7]["id"]
        assert isinstance(vc.product(pid), ProductOut) and vc.product(pid).id == pid
        photo = vc.search(image=(SOURCE / "images" / f"{pid}.jpg").read_bytes(), k=3)
        assert photo.results[0].id == pid
        assert vc.health()["status"] == "ok"
        assert "vitrine_searches_total" in vc.metrics()
        assert vc.facets(["gender"]).products > 0
        with pytest.raises(ApiError) as e:
            vc.product("no-such-product")
        assert e.value.status == 404 and e.value.code == "not_found"
        with pytest.raises(ApiError) as e:
            vc.request("POST", "/search", json={"text": "shoes", "sort": "cheapest"})
        assert e.value.status == 422 and "sort" in e.value.message


def test_async_client(url, subset_rows):
    async def go() -> tuple[SearchResponse, ProductOut]:
        async with AsyncClient(url) as vc:
            res, prod = await asyncio.gather(vc.search("women handbag", k=3, use_intent=False),
                                             vc.product(subset_rows[1]["id"]))
            with pytest.raises(ApiError):
                await vc.product("no-such-product")
            return res, prod

    res, prod = asyncio.run(go())
    assert len(res.results) == 3 and prod.id == subset_rows[1]["id"]


def test_retries_until_a_late_server_comes_up(engine):
    from vitrine.web.app import create_app

    with serving(create_app(engine=engine), delay_s=1.0) as u:
        with Client(u, retry=RetryPolicy(attempts=30, base_s=0.05, max_s=0.3)) as vc:
            assert len(vc.search("watch", k=2).results) == 2  # refused connections first, then answered


def _flaky_app(fail: int, slow_s: float = 0.0):
    """A real HTTP server that answers 503 (Retry-After: 0) ``fail`` times, then a search answer."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    seen = {"n": 0}

    async def search(_):
        seen["n"] += 1
        if slow_s:
            await asyncio.sleep(slow_s)
        if seen["n"] <= fail:
            return JSONResponse({"error": {"status": 503, "code": "unavailable", "message": "busy"}},
                                status_code=503, headers={"Retry-After": "0"})
        return JSONResponse({"results": [], "took_ms": 1.0, "k": 10})

    return Starlette(routes=[Route("/v1/search", search, methods=["POST"])]), seen


def test_retries_on_503_then_gives_up():
    app, seen = _flaky_app(fail=2)
    with serving(app) as u:
        with Client(u, retry=RetryPolicy(attempts=3, base_s=0.01)) as vc:
            assert vc.search("x").results == [] and seen["n"] == 3
        seen["n"] = -10  # more 503s than attempts: the last 503 is the error
        with Client(u, retry=RetryPolicy(attempts=3, base_s=0.01)) as vc, pytest.raises(ApiError) as e:
            vc.search("x")
        assert e.value.status == 503 and e.value.code == "unavailable"


def test_a_timeout_is_retried_then_reported():
    app, seen = _flaky_app(fail=0, slow_s=1.0)
    with serving(app) as u:
        with Client(u, timeout=0.2, retry=RetryPolicy(attempts=2, base_s=0.01)) as vc, pytest.raises(Unreachable):
            vc.search("x")
        assert seen["n"] == 2


def test_clients_send_events_on_a_search_query_id(engine, settings_factory, encoder, tmp_path):
    """search() returns the query_id events name; events()/click()/... post them (sync and async),
    each with an event_id so a retried call is stored once; a bad event is an ApiError naming it."""

    from pydantic import SecretStr

    from vitrine.search.engine import Engine
    from vitrine.web.app import create_app

    dst = tmp_path / "data"
    copy_data_dir(engine.data_dir, dst)
    eng = Engine(settings_factory(dst), encoder)
    eng.settings.web.api_key = SecretStr("w")
    eng.settings.web.events_key = SecretStr("browser")
    try:
        with serving(create_app(engine=eng)) as u, Client(u, api_key="browser") as vc:
            vc.wait_ready(60)
            page = vc.search("blue shirt", k=5, user="u1", session="s1")
            assert page.query_id
            hits = [h.id for h in page.results]
            assert vc.view(page.query_id, hits[0], 0).accepted == 1
            assert vc.click(page.query_id, hits[2], 2, user="u1").model_dump() == {"accepted": 1, "new": 1}
            assert vc.add_to_cart(page.query_id, hits[2], 2, event_id="cart-1").new == 1
            assert vc.add_to_cart(page.query_id, hits[2], 2, event_id="cart-1").new == 0  # a retry: stored once
            assert vc.purchase(page.query_id, hits[2], 2).new == 1
            got = vc.events([{"type": "click", "query_id": page.query_id, "product_id": h, "position": i}
                             for i, h in enumerate(hits)])
            assert got.accepted == got.new == len(hits)  # same content as the click above, but its own event_id
            with pytest.raises(ApiError) as e:
                vc.click(page.query_id, "not-on-the-page", 1)
            assert e.value.status == 422 and "product_id" in e.value.message

            async def go() -> tuple[str, int]:
                async with AsyncClient(u, api_key="w") as ac:
                    p = await ac.search("watch", k=3)
                    r = await ac.click(p.query_id, p.results[0].id, 0)
                    return p.query_id, r.new

            qid, new = asyncio.run(go())
            assert new == 1
        stored = [e for e in eng.feedback.log.read().events]
        assert len([e for e in stored if e.query_id == page.query_id]) == 4 + len(hits)
        assert [e.type for e in stored if e.query_id == qid] == ["click"]
    finally:
        eng.close()
