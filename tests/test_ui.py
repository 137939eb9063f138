"""The browser UI, end to end: the real app (uvicorn over the session engine) driven by a real
headless Chromium (Debian's `chromium` package through Playwright for Python).

Screenshots land in test-artifacts/ui/ (gitignored). Skipped, with the reason, only where no
Chromium can be installed (not root, or no apt-get); where ./scripts/setup could have
installed it, a missing browser is a failure. VITRINE_SKIP_BROWSER=1 skips on purpose.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

from conftest import REPO, SOURCE

pytestmark = pytest.mark.slow

ARTIFACTS = REPO / "test-artifacts" / "ui"
LAUNCH_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
]
TIMEOUT_MS = 30_000  # generous: the machine running the tests may be busy
RENDER_TIMES: list[dict] = []


def _unavailable(reason: str) -> None:
    """Skip where a browser cannot be had; fail where ./scripts/setup would have installed it."""
    if os.environ.get("VITRINE_SKIP_BROWSER") == "1":
        pytest.skip(f"VITRINE_SKIP_BROWSER=1: {reason}")
    can_install = hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get")
    if can_install:
        pytest.fail(f"{reason}; this machine can install it: run ./scripts/setup "
                    "(or set VITRINE_SKIP_BROWSER=1 to skip the browser tests)")
    pytest.skip(f"{reason} (not root or no apt-get here, so it cannot be installed: "
                "`apt-get install chromium` and `pip install playwright` enable these tests)")


def _chromium() -> str | None:
    for c in (os.environ.get("VITRINE_CHROMIUM"), shutil.which("chromium"), "/usr/bin/chromium",
              shutil.which("chromium-browser")):
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    return None


# -- the server and the browser ------------------------------------------------------------------

@pytest.fixture(scope="module")
def base_url(engine):
    """The real app (API + UI) over the session engine, served by uvicorn on a free port."""
    import uvicorn

    from vitrine.web.app import create_app

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(engine=engine), log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 600  # the lifespan warms the engine up first (slow on a busy machine)
    while not server.started:
        assert thread.is_alive() and time.time() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(15)
    sock.close()


@pytest.fixture(scope="module")
def api(base_url):
    with httpx.Client(base_url=base_url, timeout=60) as c:
        yield c


def chromium_session():  # a generator of one Browser
    """One headless Chromium for the test session (Playwright gives each launch a fresh profile
    dir): conftest.py's ``browser`` fixture, the one every UI test module shares (a second
    sync_playwright while one runs fails)."""
    exe = _chromium()
    if exe is None:
        _unavailable("Debian's chromium is not installed")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("the Python package playwright is not installed (it is in the `test` extra)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, headless=True, args=LAUNCH_ARGS)
        yield b
        b.close()
    if RENDER_TIMES:
        (ARTIFACTS / "render-times.json").write_text(json.dumps(RENDER_TIMES, indent=2))


@pytest.fixture()
def page(browser, base_url):
    """A fresh browser context (own storage) at desktop size; fails the test on a JS error."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    ctx.set_default_timeout(TIMEOUT_MS)
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))
    pg.on("console", lambda m: errors.append(f"console.{m.type}: {m.text}")
          if m.type == "error" and "Failed to load resource" not in m.text else None)
    pg.goto(base_url + "/")
    pg.wait_for_selector("body[data-ready='1']")
    yield pg
    ctx.close()
    assert not errors, errors


# -- helpers ----------------------------------------------------------------------------------------

def renders(page) -> int:
    return page.evaluate("window.vitrine.renders")


def wait_render(page, before: int, what: str) -> None:
    page.wait_for_function(f"window.vitrine.renders > {before}")
    page.wait_for_function("window.vitrine.lastFrameMs !== null")
    RENDER_TIMES.append({"what": what, **page.evaluate(
        "({dom_ms: window.vitrine.lastRenderMs, frame_ms: window.vitrine.lastFrameMs,"
        " results: document.querySelectorAll('#results .card').length})")})


def is_search(r) -> bool:
    return r.url.endswith("/search") and r.request.method == "POST"


def type_query(page, text: str) -> dict:
    """Type words and press Enter; returns the JSON request the UI sent (after the render)."""
    before = renders(page)
    with page.expect_response(is_search) as info:
        box = page.get_by_label("Search words")
        box.fill(text)
        box.press("Enter")
    assert info.value.ok, info.value.text()
    wait_render(page, before, f"text: {text}")
    return info.value.request.post_data_json


def card_ids(page) -> list[str]:
    return page.eval_on_selector_all("#results .card", "els => els.map(e => e.dataset.id)")


def shot(page, name: str, full: bool = True) -> None:
    """A screenshot artifact, once the photos in view have loaded."""
    page.wait_for_function("""[...document.images].filter(i => i.offsetParent && i.src && i.loading !== 'lazy')
        .every(i => i.complete)""")
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=full)


def photo(pid: str) -> Path:
    return SOURCE / "images" / f"{pid}.jpg"


# -- tests ------------------------------------------------------------------------------------------

def test_first_visit_shows_welcome_with_catalogue_size(page, engine):
    assert page.title().startswith("Vitrine")
    page.wait_for_function("document.querySelector('#catalog-stats').textContent.length > 0")
    assert f"{len(engine):,} products" in page.inner_text("#catalog-stats")
    assert page.get_by_role("search").is_visible()
    page.wait_for_selector("body[data-ui-config='1']")  # examples from the catalogue (static/suggest.js)
    assert page.locator(".example").count() >= 3
    shot(page, "01-welcome")


def test_text_query_results_match_the_api(page, api):
    # a query whose slot filters (gender=Men, category=Shoes) still leave more than one row of cards
    req = type_query(page, "men shoes")
    assert req["text"] == "men shoes" and req["explain"] is True
    want = api.post("/search", json=req).json()
    assert want["results"], want
    assert card_ids(page) == [h["id"] for h in want["results"]]
    titles = page.locator("#results .card-title").all_inner_texts()
    assert titles == [h["title"] for h in want["results"]]
    # every photo is the API's, lazy-loaded past the first row
    imgs = page.eval_on_selector_all("#results .card img", "els => els.map(e => [e.getAttribute('src'), e.loading])")
    assert [src for src, _ in imgs] == [h["image_url"] for h in want["results"]]
    assert all(lazy == "lazy" for _, lazy in imgs[8:]) and imgs[8:]
    assert page.locator("#view-search").get_attribute("data-state") == "results"
    # the detected intent and slots, when the API returns them
    if want.get("intent"):
        assert want["intent"]["label"].replace("_", " ") in page.inner_text("#understood")
    for name, value in (want.get("slots") or {}).items():
        if value not in (None, ""):
            assert page.locator(f"#understood .chip.slot[data-slot='{name}']").count() == 1
    # "why this result": the first hit's explanation, with every signal the API gave
    first = page.locator("#results .card").first
    why = first.get_by_role("button", name="Why this result?")
    assert why.get_attribute("aria-expanded") == "false"
    why.click()
    panel = first.locator(".why")
    assert panel.is_visible() and why.get_attribute("aria-expanded") == "true"
    text = panel.inner_text()
    shown = re.search(r"Score (-?[0-9.]+)", text)
    assert shown and abs(float(shown.group(1)) - want["results"][0]["score"]) < 1e-3, text
    for signal in want["results"][0]["explanation"]["signals"]:
        assert signal in text
    shot(page, "02-text-results")
    why.click()
    assert not panel.is_visible()


def test_photo_upload_drop_and_paste_find_the_product(page, subset_rows):
    # upload through the file input
    pid = subset_rows[37]["id"]
    before = renders(page)
    with page.expect_response(is_search) as info:
        page.set_input_files("#photo-input", str(photo(pid)))
    assert info.value.ok and info.value.request.post_data_json["image_b64"].startswith("data:image/jpeg;base64,")
    wait_render(page, before, "photo upload")
    assert card_ids(page)[0] == pid
    assert page.locator("#photo-chip").is_visible()
    assert "photo" in page.inner_text("#understood")
    shot(page, "03-photo-results")

    # drag and drop a file onto the search box, and paste one from the clipboard
    for n, how in ((91, "drop"), (150, "paste")):
        pid = subset_rows[n]["id"]
        b64 = base64.b64encode(photo(pid).read_bytes()).decode()
        before = renders(page)
        page.evaluate("""([b64, how]) => {
            const bin = atob(b64), bytes = new Uint8Array(bin.length);
            for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
            const dt = new DataTransfer();
            dt.items.add(new File([bytes], how + '.jpg', {type: 'image/jpeg'}));
            const ev = how === 'drop'
              ? new DragEvent('drop', {dataTransfer: dt, bubbles: true, cancelable: true})
              : new ClipboardEvent('paste', {clipboardData: dt, bubbles: true, cancelable: true});
            document.getElementById(how === 'drop' ? 'dropzone' : 'q').dispatchEvent(ev);
        }""", [b64, how])
        wait_render(page, before, f"photo {how}")
        assert card_ids(page)[0] == pid, how

    # removing the photo with words still in the box searches by the words alone
    before = renders(page)
    page.get_by_label("Search words").fill("watch")
    page.get_by_role("button", name="Remove the photo").click()
    wait_render(page, before, "photo removed")
    assert page.evaluate("window.vitrine.lastRequest.image_b64") is None
    assert not page.locator("#photo-chip").is_visible()


def test_filter_chips_narrow_every_card(page, api):
    type_query(page, "shirt")
    total = len(card_ids(page))
    # a gender chip
    chip = page.locator("#filters .chip-btn[data-field='gender'][aria-pressed='false']").first
    gender = chip.get_attribute("data-value")
    before = renders(page)
    with page.expect_response(is_search) as info:
        chip.click()
    wait_render(page, before, f"filter gender={gender}")
    req = info.value.request.post_data_json
    assert req["filters"] == {"gender": gender}
    genders = page.eval_on_selector_all("#results .card", "els => els.map(e => e.dataset.gender)")
    assert genders and all(g.casefold() == gender.casefold() for g in genders), genders
    assert card_ids(page) == [h["id"] for h in api.post("/search", json=req).json()["results"]]
    assert page.locator(f"#filters .chip-btn[data-value='{gender}']").get_attribute("aria-pressed") == "true"
    assert "gender=" in page.evaluate("location.hash")

    # and a colour chip on top: both filters hold on every card
    chip = page.locator("#filters .chip-btn[data-field='colour'][aria-pressed='false']").first
    colour = chip.get_attribute("data-value")
    before = renders(page)
    chip.click()
    wait_render(page, before, f"filter colour={colour}")
    cards = page.eval_on_selector_all("#results .card", "els => els.map(e => [e.dataset.gender, e.dataset.colour])")
    assert cards and all(g.casefold() == gender.casefold() and c.casefold() == colour.casefold()
                         for g, c in cards), cards
    shot(page, "04-filtered")

    # a category chip narrows by any level of the path
    chip = page.locator("#filters .chip-btn[data-field='category'][aria-pressed='false']").first
    if chip.count():
        cat = chip.get_attribute("data-value")
        before = renders(page)
        chip.click()
        wait_render(page, before, f"filter category={cat}")
        cats = page.eval_on_selector_all("#results .card", "els => els.map(e => e.dataset.category)")
        assert all(cat.casefold() in [x.casefold() for x in c.split(" > ")] for c in cats), cats

    # clearing the filters brings the unfiltered results back
    before = renders(page)
    page.get_by_role("button", name="Clear filters").click()
    wait_render(page, before, "filters cleared")
    assert len(card_ids(page)) == total
    # "More" reveals catalogue-wide values from GET /facets
    facets = api.get("/facets", params={"field": "colour"}).json()["facets"]["colour"]
    more = page.locator("#filters .chip.more[data-field='colour']")
    if len(facets) > 8:
        more.click()
        shown = page.eval_on_selector_all("#filters .chip-btn[data-field='colour']",
                                          "els => els.map(e => e.dataset.value)")
        assert {f["value"] for f in facets} <= set(shown)


def test_a_misspelt_query_says_what_was_searched(page, api):
    """A word read as the catalogue's (query.corrected) is shown with the words as typed."""
    req = type_query(page, "black wacth")
    want = api.post("/v1/search", json=req).json()
    assert want["query"]["corrected"] == "black watch"
    assert "for “black watch” (you typed “black wacth”)" in page.inner_text("#status")
    assert card_ids(page) == [h["id"] for h in want["results"]]


def test_more_results_sort_and_facet_counts_from_the_response(page, api):
    """The UI asks for facets and highlights, shows the API's counts on its chips, pages with
    "More results" (the next page of the same order, no duplicates) and sorts."""
    query = next(q for q in ("men", "shirt", "shoes", "women", "black") if api.post(
        "/v1/search", json={"text": q, "k": 24, "facets": ["gender"]}).json()["total"] > 24)
    req = type_query(page, query)
    assert req["facets"] == ["gender", "category", "colour"] and req["highlight"] is True and req["k"] == 24
    want = api.post("/v1/search", json=req).json()
    # the chips' counts are the response's facet counts (among every matching product)
    checked = 0
    for f in ("gender", "category", "colour"):
        for fv in want["facets"][f]:
            chip = page.locator(f"#filters .chip-btn[data-field='{f}'][data-value='{fv['value']}']")
            if chip.count() and fv["count"] < want["total"]:  # a value that would narrow the results
                assert chip.get_attribute("title").startswith(f"{fv['count']} matching"), (f, fv)
                checked += 1
    assert checked
    assert f"of {'' if want['total_exact'] else 'about '}{want['total']:,} results" in page.inner_text("#status")
    # "More results": the next page, appended
    first_page = card_ids(page)
    with page.expect_response(is_search) as info:
        page.get_by_role("button", name="More results").click()
    nxt = info.value.request.post_data_json
    assert nxt["offset"] == 24 and nxt["text"] == query
    page.wait_for_function("document.querySelectorAll('#results .card').length > 24")
    both = card_ids(page)
    assert both[:24] == first_page and len(set(both)) == len(both)
    assert both[24:] == [h["id"] for h in api.post("/v1/search", json=nxt).json()["results"]]
    # highlighted words are <mark> elements, built from the API's spans
    marks = page.eval_on_selector_all("#results .card-title mark", "els => els.map(e => e.textContent)")
    # (typo-tolerant, as BM25: "shirt" also marks the "Tshirt" it matched)
    assert marks and all(query[:3] in m.casefold() for m in marks), marks
    shot(page, "06-more-results")
    # a sort order: the request says it, the address keeps it
    before = renders(page)
    with page.expect_response(is_search) as info:
        page.select_option("#sort", "newest")
    wait_render(page, before, "sort newest")
    assert info.value.request.post_data_json["sort"] == "newest" and "sort=newest" in page.evaluate("location.hash")
    assert card_ids(page) == [h["id"] for h in api.post("/v1/search", json=info.value.request.post_data_json)
                              .json()["results"]]


def test_product_page_shows_recommendations(page, api):
    type_query(page, "men shirt")
    first = page.locator("#results .card").first
    pid = first.get_attribute("data-id")
    first.locator(".card-link").click()
    page.wait_for_selector(f"#product[data-id='{pid}']")
    product = api.get(f"/products/{pid}").json()
    assert page.inner_text("#product-title") == product["title"]
    assert page.get_attribute("#product-img", "src") == product["image_url"]
    attrs = page.inner_text("#product-attrs")
    assert all(str(v) in attrs for v in product["attributes"].values())
    for kind, sel in (("similar", "#rec-similar"), ("complementary", "#rec-complementary")):
        r = api.get(f"/recommend/{pid}", params={"kind": kind, "k": 12})
        assert r.status_code == 200, f"GET /recommend ({kind}): {r.status_code} {r.text[:200]}"
        want = [h["id"] for h in r.json()["results"]]
        page.wait_for_selector(f"{sel}:not([data-state='loading'])", state="attached")
        got = page.eval_on_selector_all(f"{sel} .mini", "els => els.map(e => e.dataset.id)")
        assert got == want, kind
        if kind == "similar":
            assert got, "no similar products shown"
            assert page.locator(sel).is_visible()
        rel = [h.get("relation") for h in r.json()["results"]]
        if got and rel[0]:
            assert rel[0] in page.locator(f"{sel} .mini").first.inner_text()
    shot(page, "05-product")
    # a recommendation opens its own product page; Back returns to the results
    nxt = page.locator("#rec-similar .mini a").first
    nid = page.locator("#rec-similar .mini").first.get_attribute("data-id")
    nxt.click()
    page.wait_for_selector(f"#product[data-id='{nid}']")
    page.go_back()
    page.go_back()
    page.wait_for_selector("#view-search:not([hidden]) #results .card")
    assert page.locator("#results .card").first.get_attribute("data-id") == pid


def test_compare_two_products_side_by_side(page, api):
    type_query(page, "sports shoes")
    cards = page.locator("#results .card")
    ids = [cards.nth(i).get_attribute("data-id") for i in (0, 1)]
    for i in (0, 1):
        cards.nth(i).get_by_label("Compare").check()
    tray = page.get_by_role("complementary", name="Compare tray")
    assert tray.is_visible()
    assert page.eval_on_selector_all("#tray-items li", "els => els.map(e => e.dataset.id)") == ids
    with page.expect_response(lambda r: r.url.endswith("/compare") and r.request.method == "POST") as info:
        page.get_by_role("button", name="Compare (2)").click()
    assert info.value.status == 200, f"POST /compare: {info.value.status} {info.value.text()[:200]}"
    assert info.value.request.post_data_json == {"ids": ids}
    page.wait_for_selector("#compare:not([hidden]) #compare-table")
    heads = page.eval_on_selector_all("#compare-table thead th", "els => els.map(e => e.dataset.id)")
    assert heads == ids
    want = api.post("/compare", json={"ids": ids}).json()
    head_text = page.inner_text("#compare-table thead")
    for p in want["products"]:
        assert p["title"] in head_text
    # every attribute row of the API's table, the differing ones marked (currency goes with the price)
    rows = page.eval_on_selector_all("#compare-table tbody tr", "els => els.map(e => e.dataset.attr)")
    names = [a["name"] for a in want["attributes"] if not (a["name"] == "currency" and "price" in rows)]
    assert names and set(names) <= set(rows)
    differ = page.eval_on_selector_all("#compare-table tbody tr.differs", "els => els.map(e => e.dataset.attr)")
    assert {a["name"] for a in want["attributes"] if not a["same"]} - {"currency"} <= set(differ)
    assert {a["name"] for a in want["attributes"] if a["same"]} & set(differ) == set()
    cells = page.eval_on_selector_all("#compare-table tbody tr[data-attr='category'] td",
                                      "els => els.map(e => e.innerText)")
    cat = next(a for a in want["attributes"] if a["name"] == "category")
    assert cells == [str(cat["values"][i]) for i in ids]
    if want.get("summary"):
        assert want["summary"] in page.inner_text("#compare-summary")
    assert page.locator("#compare-pairs li").count() == len(want["pairwise"])
    shot(page, "06-compare")
    # "only differences" hides the rows that are the same
    page.get_by_label("Show only differences").check()
    assert all(not r.is_visible() for r in page.locator("#compare-table tr.same").all())
    assert not page.locator("#tray").is_visible()  # the comparison itself replaces the tray
    # the tray survives a reload (localStorage) and removing an item updates it
    page.reload()
    page.wait_for_selector("body[data-ready='1']")
    page.get_by_role("link", name="← Back to results").click()
    page.wait_for_selector("#view-search:not([hidden]) #results .card")
    assert page.locator("#tray").is_visible() and page.locator("#tray-items li").count() == 2
    page.locator("#tray-items li").first.get_by_role("button").click()
    assert page.locator("#tray-items li").count() == 1
    assert page.get_by_role("button", name="Compare (1)").is_disabled()


def test_compare_intent_query_opens_the_comparison(page, api):
    """"A vs B" opens the comparison: the server's compare-intent result when /search returns one,
    else (a server without the intent model) the UI asks POST /compare with the words."""
    q = "nike vs puma sports shoes"
    body = api.post("/search", json={"text": q, "k": 24, "explain": True}).json()
    if body.get("compare"):
        want = [p["id"] for p in body["compare"]["products"]]
    elif not body.get("intent"):
        r = api.post("/compare", json={"text": q})
        assert r.status_code == 200, f"POST /compare text: {r.status_code} {r.text[:200]}"
        want = [p["id"] for p in r.json()["products"]]
    else:
        pytest.skip(f"the intent model labelled {q!r} as {body['intent'].get('label')!r}, not compare")
    type_query(page, q)
    page.wait_for_selector("#compare:not([hidden]) #compare-table")
    assert page.evaluate("location.hash").startswith("#/compare?ids=")
    assert page.eval_on_selector_all("#compare-table thead th", "els => els.map(e => e.dataset.id)") == want
    shot(page, "07-compare-intent")
    # Back shows the results of the query without jumping to the comparison again
    page.go_back()
    page.wait_for_selector("#view-search:not([hidden]) #results .card")
    assert page.evaluate("location.hash").startswith("#/search")
    page.wait_for_timeout(300)
    assert page.evaluate("location.hash").startswith("#/search")


def test_empty_and_error_states_say_what_happened(page, base_url, api):
    st = page.locator("#status")
    # nothing to search with: said at once, nothing sent
    page.get_by_label("Search words").fill("   ")
    page.get_by_label("Search words").press("Enter")
    assert "Type some words or add a photo" in st.inner_text()

    # a file that is not an image: refused before it is sent
    page.set_input_files("#photo-input", {"name": "notes.txt", "mimeType": "text/plain", "buffer": b"hello"})
    page.wait_for_function("document.querySelector('#status').textContent.includes('not an image')")

    # a broken photo: the server's own error, shown as it said it
    bad = {"image_b64": "data:image/jpeg;base64," + base64.b64encode(b"not really a jpeg").decode()}
    err = api.post("/search", json={**bad, "k": 24, "explain": True}).json()["error"]
    with page.expect_response(is_search) as info:
        page.set_input_files("#photo-input", {"name": "broken.jpg", "mimeType": "image/jpeg",
                                              "buffer": b"not really a jpeg"})
    assert info.value.status == 422
    alert = page.get_by_role("alert")
    alert.wait_for()
    assert err["message"] in alert.inner_text() and "422" in alert.inner_text()
    assert page.locator("#view-search").get_attribute("data-state") == "error"
    shot(page, "08-error")

    # no product matches: say so and offer to clear the filters
    page.get_by_role("button", name="Remove the photo").click()
    page.goto(base_url + "/#/search?q=shoes&colour=No-Such-Colour")
    page.wait_for_selector("#view-search[data-state='empty']")
    assert "No products found" in st.inner_text()
    shot(page, "09-empty")
    before = renders(page)
    page.get_by_role("button", name="Clear the filters").click()
    wait_render(page, before, "clear after empty")
    assert page.locator("#results .card").count() > 0

    # an unknown product id
    page.goto(base_url + "/#/product/no-such-product")
    page.wait_for_function("document.querySelector('#product-status').textContent.includes('no product')")
    assert page.locator("#product").is_hidden()


def test_phone_width_and_keyboard_only(browser, base_url):
    ctx = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=2, has_touch=True)
    ctx.set_default_timeout(TIMEOUT_MS)
    page = ctx.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(base_url + "/")
        page.wait_for_selector("body[data-ready='1']")
        # "/" jumps to the search box; Enter searches
        page.keyboard.press("/")
        assert page.evaluate("document.activeElement.id") == "q"
        before = renders(page)
        page.keyboard.type("women handbag")
        page.keyboard.press("Enter")
        wait_render(page, before, "phone: text")
        assert page.locator("#results .card").count() > 0
        # nothing is wider than the phone
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
        # two cards a row
        boxes = [page.locator("#results .card").nth(i).bounding_box() for i in range(2)]
        assert boxes[0]["y"] == boxes[1]["y"] and boxes[1]["x"] + boxes[1]["width"] <= 390
        shot(page, "10-phone-results", full=False)
        # every control has a name a screen reader can say
        unnamed = page.evaluate("""() => [...document.querySelectorAll('button, a[href], input, [role=button]')]
            .filter(e => e.offsetParent !== null || e.type === 'file')
            .filter(e => {
                const labelled = e.getAttribute('aria-labelledby');
                const name = (e.getAttribute('aria-label')
                    || (labelled && document.getElementById(labelled)?.textContent)
                    || [...(e.labels || [])].map(l => l.textContent).join('')
                    || e.textContent || e.title || '').trim();
                return !name;
            }).map(e => e.outerHTML.slice(0, 120))""")
        assert not unnamed, unnamed
        # Tab to the first result and open it with Enter
        for _ in range(80):
            page.keyboard.press("Tab")
            if page.evaluate("document.activeElement.classList.contains('card-link')"):
                break
        else:
            pytest.fail("could not reach a result with Tab")
        pid = page.evaluate("document.activeElement.closest('.card').dataset.id")
        page.keyboard.press("Enter")
        page.wait_for_selector(f"#product[data-id='{pid}']")
        assert page.evaluate("document.activeElement.id") == "product-title"
        # add to compare with the keyboard
        page.focus("#product-compare")
        page.keyboard.press("Enter")
        assert page.get_attribute("#product-compare", "aria-pressed") == "true"
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
        page.wait_for_selector("#rec-similar:not([data-state='loading'])", state="attached")
        shot(page, "11-phone-product", full=False)
    finally:
        ctx.close()
    assert not errors, errors


def test_facets_endpoint_counts_the_catalogue(api, subset_rows):
    """GET /facets (the filter chips' values): counts per value, most common first; bad input is a 422."""
    body = api.get("/facets", params={"field": ["gender", "colour"], "limit": 3}).json()
    assert body["products"] == len(subset_rows) and set(body["facets"]) == {"gender", "colour"}
    genders = body["facets"]["gender"]
    want: dict[str, int] = {}
    for r in subset_rows:
        want[r["gender"]] = want.get(r["gender"], 0) + 1
    assert len(genders) == 3 and [g["count"] for g in genders] == sorted(want.values(), reverse=True)[:3]
    assert all(want[g["value"]] == g["count"] for g in genders)
    assert set(api.get("/facets").json()["facets"]) == {"category", "gender", "colour", "brand"}
    r = api.get("/facets", params={"field": "flavour"})
    assert r.status_code == 422 and "flavour" in r.json()["error"]["message"]
    assert api.get("/facets", params={"limit": 0}).status_code == 422
