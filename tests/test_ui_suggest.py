"""The UI's search-as-you-type box, catalogue-made examples, shopper events and the text-only
page, in headless Chromium (as tests/test_ui.py drives it) against real uvicorn servers: one over
the session engine (photos), one over a small text-only catalogue with an events key."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from test_ui import ARTIFACTS, TIMEOUT_MS

pytestmark = pytest.mark.slow

EVENTS_KEY = "browser-events-key"
TEXT_ONLY = [
    ("L1", "Broadway Lever Door Handle", "Hardware > Door Hardware > Door Handles", "Broadway"),
    ("L2", "Broadway Round Knob Satin Nickel", "Hardware > Door Hardware > Door Knobs", "Broadway"),
    ("S1", "Belkin Surge Protector 6 Outlet", "Electronics > Power > Surge Protectors", "Belkin"),
    ("S2", "APC Surge Protector 11 Outlet", "Electronics > Power > Surge Protectors", "APC"),
    ("T1", "Oak Coffee Table", "Furniture > Living Room > Coffee Tables", "Kettle & Co"),
    ("T2", "Walnut Side Table", "Furniture > Living Room > Side Tables", "Kettle & Co"),
]


def serve(engine):
    """uvicorn over ``engine`` on a free port; returns (base url, stop)."""
    import uvicorn

    from vitrine.web.app import create_app

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(engine=engine), log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 600
    while not server.started:
        assert thread.is_alive() and time.time() < deadline, "uvicorn did not start"
        time.sleep(0.05)

    def stop() -> None:
        server.should_exit = True
        thread.join(15)
        sock.close()

    return f"http://127.0.0.1:{sock.getsockname()[1]}", stop


@pytest.fixture(scope="module")
def photo_url(engine):
    from pydantic import SecretStr

    before = engine.settings.web.events_key
    engine.settings.web.events_key = SecretStr(EVENTS_KEY)
    url, stop = serve(engine)
    yield url
    stop()
    engine.settings.web.events_key = before


@pytest.fixture(scope="module")
def text_engine(settings_factory, encoder, tmp_path_factory):
    from pydantic import SecretStr

    from vitrine.search.engine import Engine
    from vitrine.search.writes import ProductInput
    from vitrine.search.models import Product

    eng = Engine(settings_factory(tmp_path_factory.mktemp("text-only")), encoder)
    eng.upsert([ProductInput(Product(id=i, title=t, category=c, brand=b, price=10.0 + n, currency="USD"))
                for n, (i, t, c, b) in enumerate(TEXT_ONLY)])
    eng.settings.web.events_key = SecretStr(EVENTS_KEY)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def text_url(text_engine):
    url, stop = serve(text_engine)
    yield url
    stop()


def open_page(browser, url):
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    ctx.set_default_timeout(TIMEOUT_MS)
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))
    pg.on("console", lambda m: errors.append(f"console.{m.type}: {m.text}")
          if m.type == "error" and "Failed to load resource" not in m.text else None)
    pg.goto(url + "/")
    pg.wait_for_selector("body[data-ready='1']")
    pg.wait_for_selector("body[data-ui-config='1']")
    return ctx, pg, errors


@pytest.fixture()
def page(browser, photo_url):
    ctx, pg, errors = open_page(browser, photo_url)
    yield pg
    ctx.close()
    assert not errors, errors


@pytest.fixture()
def text_page(browser, text_url):
    ctx, pg, errors = open_page(browser, text_url)
    yield pg
    ctx.close()
    assert not errors, errors


def suggestions(page) -> list[str]:
    page.wait_for_selector("#suggestions:not([hidden]) .suggestion")
    return page.eval_on_selector_all("#suggestions .sugg-text", "els => els.map(e => e.textContent)")


def type_prefix(page, text: str) -> list[str]:
    box = page.get_by_label("Search words")
    box.click()
    with page.expect_response(lambda r: "/v1/suggest?" in r.url and r.ok):
        box.press_sequentially(text, delay=20)
    page.wait_for_function("() => window.vitrine.suggestions && "
                           "window.vitrine.suggestions.q === document.querySelector('#q').value")
    return suggestions(page)


def test_examples_come_from_the_catalogue(page, engine):
    examples = page.eval_on_selector_all(".example", "els => els.map(e => e.dataset.q)")
    assert len(examples) >= 3 and "red dress for women" not in examples
    want = [s.text for s in engine.suggest("", 6).suggestions]
    assert examples == want
    with page.expect_response(lambda r: r.url.endswith("/search") and r.request.method == "POST") as info:
        page.locator(".example").first.click()
    assert info.value.request.post_data_json["text"] == examples[0]


def test_typing_shows_suggestions_also_with_a_typo(page):
    got = type_prefix(page, "tshi")
    assert got and all("tshi" in t.casefold() for t in got)
    page.get_by_label("Search words").fill("")
    got = type_prefix(page, "tshrit")  # a swap of two letters
    assert any("tshirt" in t.casefold() for t in got), got
    page.screenshot(path=str(ARTIFACTS / "suggest-01-typo.png"))
    # keyboard: down, down, Enter searches the second suggestion
    box = page.get_by_label("Search words")
    box.press("ArrowDown")
    box.press("ArrowDown")
    assert page.get_attribute("#suggestions .suggestion:nth-child(2)", "aria-selected") == "true"
    assert box.get_attribute("aria-activedescendant") == "sugg-1"
    with page.expect_response(lambda r: r.url.endswith("/search") and r.request.method == "POST") as info:
        box.press("Enter")
    assert info.value.request.post_data_json["text"] == got[1]
    assert page.is_hidden("#suggestions")
    # Escape closes; Enter without a highlighted suggestion searches what was typed
    box.fill("")
    type_prefix(page, "wat")
    box.press("Escape")
    assert page.is_hidden("#suggestions")


def test_a_click_on_a_result_sends_a_click_event(page, engine):
    box = page.get_by_label("Search words")
    with page.expect_response(lambda r: r.url.endswith("/search") and r.request.method == "POST") as info:
        box.fill("black shoes")
        box.press("Enter")
    resp = info.value.json()
    page.wait_for_selector("#results .card")
    before = engine.feedback.log.counts()["events"]
    third = page.locator("#results .card").nth(2)
    with page.expect_request(lambda r: r.url.endswith("/v1/events") and r.method == "POST") as req_info:
        third.locator("a.card-link").click()
    req = req_info.value
    assert req.headers["x-api-key"] == EVENTS_KEY
    ev = req.post_data_json["events"][0]
    assert ev["type"] == "click" and ev["query_id"] == resp["query_id"] and ev["position"] == 2
    assert ev["product_id"] == resp["results"][2]["id"] and ev["session"]
    assert req.response().status == 202, req.response().text()
    assert engine.feedback.log.counts()["events"] == before + 1
    # the product page it opened: add to cart sends add_to_cart for that result
    page.wait_for_selector("#product:not([hidden])")
    with page.expect_request(lambda r: r.url.endswith("/v1/events") and r.method == "POST") as cart_info:
        page.click("#product-cart")
    cart = cart_info.value.post_data_json["events"][0]
    assert cart == {**ev, "type": "add_to_cart"}
    assert cart_info.value.response().status == 202
    assert page.inner_text("#product-cart").startswith("Added")
    page.screenshot(path=str(ARTIFACTS / "suggest-02-product-cart.png"))


def test_text_only_catalogue_gets_a_page_made_for_it(text_page):
    pg = text_page
    assert pg.evaluate("document.body.classList.contains('no-photos')")
    assert pg.is_hidden("#photo-btn")
    assert "photo" not in pg.get_attribute("#q", "placeholder").lower()
    assert "photo" not in pg.inner_text("#welcome").lower()
    examples = pg.eval_on_selector_all(".example", "els => els.map(e => e.dataset.q)")
    assert examples and not {"red dress for women", "nike vs puma sports shoes"} & set(examples)
    pg.screenshot(path=str(ARTIFACTS / "suggest-03-text-only-home.png"))
    got = type_prefix(pg, "surg")
    assert "Surge Protectors" in got
    got = type_prefix(pg, " prtector")  # "surg prtector": a typo in the word being typed
    assert any("Surge Protector" in t for t in got), got
    with pg.expect_response(lambda r: r.url.endswith("/search") and r.request.method == "POST") as info:
        pg.get_by_label("Search words").fill("broadway lever")
        pg.get_by_label("Search words").press("Enter")
    body = info.value.json()
    assert body["intent"]["label"] == "search"  # "lever" is a catalogue word, not "leave"
    pg.wait_for_selector("#results .card")
    # no empty photo boxes: the cards show no photo area at all
    visible_ph = pg.eval_on_selector_all("#results .card .ph, #results .noimg",
                                         "els => els.filter(e => e.offsetParent !== null).length")
    assert visible_ph == 0
    assert pg.locator("#results .card").first.inner_text().startswith("Broadway Lever")
    pg.screenshot(path=str(ARTIFACTS / "suggest-04-text-only-results.png"), full_page=True)
    pg.locator("#results .card a.card-link").first.click()
    pg.wait_for_selector("#product:not([hidden])")
    assert pg.is_hidden("#product-visual") and pg.is_hidden(".product-photo")
    assert pg.is_visible("#product-cart")
