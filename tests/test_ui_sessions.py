"""The UI's shopping session (static/session.js), end to end in the real browser: every search of a
tab carries one session id (kept across reloads), the session's chips show and each is removable,
and "New search" makes the next search start over."""

from __future__ import annotations

import pytest
from test_ui import api, base_url, page, renders, type_query, wait_render  # noqa: F401  (fixtures)

pytestmark = pytest.mark.slow


def test_session_chips_removable_new_search_and_kept_across_reloads(page):
    first = type_query(page, "men shoes")
    sid = first["session"]
    assert sid and "new_search" not in first
    second = type_query(page, "in black")
    assert second["session"] == sid
    chip = "#session-bar .session-chip[data-key='colour:Black']"
    page.wait_for_selector(chip)
    sess = page.evaluate("window.vitrine.lastResponse.session")
    assert sess["new_search"] is False and sess["filters"]["colour"] == "Black"
    assert page.locator("#session-bar").is_visible()

    before = renders(page)
    page.locator(f"{chip} .session-chip-x").click()
    wait_render(page, before, "session chip removed")
    page.wait_for_function(f"!document.querySelector(\"{chip}\")")
    sess = page.evaluate("window.vitrine.lastResponse.session")
    assert "colour" not in sess["filters"] and sess["decided_by"] == "drop"

    page.locator("#session-new").click()
    third = type_query(page, "in blue")
    assert third["new_search"] is True and third["session"] == sid

    page.reload()
    page.wait_for_selector("body[data-ready='1']")
    again = type_query(page, "watches")
    assert again["session"] == sid and "new_search" not in again
