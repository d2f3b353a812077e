"""A phone-sized screen (390 px) in a real headless Chromium: every control of every main page
(Rotate and Revoke on keys, Install on the catalog, each table's links and buttons) is within the
screen, or inside a table box that scrolls and says so above it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import Stack, body
from tests.ui.conftest import Shots
from tests.ui.test_browser import sign_in

WIDTH = 390
# Every visible control that sticks out of the screen sideways, unless it is inside a table box
# that scrolls, is marked so by arbiter.js and shows its hint. The skip link is off-screen until
# it has the focus, on purpose.
OFF_SCREEN = """() => {
  const out = [];
  for (const el of document.querySelectorAll('a[href], button, input:not([type=hidden]), select, textarea, summary')) {
    const r = el.getBoundingClientRect();
    if (r.width <= 1 || r.height <= 1 || el.classList.contains('skip')) continue;
    if (r.left >= -0.5 && r.right <= window.innerWidth + 0.5) continue;
    const box = el.closest('.table-wrap');
    const hint = box && box.previousElementSibling;
    if (box && box.dataset.scrolls === '1' && box.scrollWidth > box.clientWidth
        && hint && hint.classList.contains('scroll-hint') && !hint.hidden) continue;
    out.push(el.tagName + ' "' + (el.textContent || el.name || '').trim().slice(0, 40) + '" at '
             + Math.round(r.left) + '..' + Math.round(r.right));
  }
  return out;
}"""


@pytest.fixture
def narrow(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": WIDTH, "height": 844})
    context.set_default_timeout(10_000)
    page = context.new_page()
    page.on("dialog", lambda dialog: dialog.accept())
    try:
        yield page
    finally:
        context.close()


def signed_in(page: Any, stack: Stack) -> str:
    base = stack.gateway.url
    sign_in(page, base, stack.admin_key)
    page.wait_for_url(f"{base}/ui/services")
    return base


def test_no_control_of_a_main_page_is_off_screen(narrow: Any, stack: Stack, shots: Shots) -> None:
    with stack.client("admin") as admin:
        keys = body(admin.get("/admin/projects/acme/keys"), 200)["data"]
        body(admin.post("/admin/projects/acme/keys", json={"name": "a-key-with-a-rather-long-name-for-a-phone"}), 201)
        body(admin.post(f"/admin/keys/{keys[0]['id']}/rotate", json={"grace_seconds": 600}), 201)
        body(admin.post("/admin/aliases", json={"alias": "jev-latest", "model": "nimble"}), 201)
        body(admin.patch("/admin/projects/acme", json={"requests_per_minute": 60, "tokens_per_minute": None}), 200)
        project_id = body(admin.get("/admin/projects/acme"), 200)["id"]
        service_id = body(admin.get("/admin/services/ollama"), 200)["id"]
    base = signed_in(narrow, stack)
    pages = ["/ui/services", f"/ui/services/{service_id}", "/ui/models", "/ui/projects", f"/ui/projects/{project_id}",
             "/ui/organizations", "/ui/usage", "/ui/audit", "/ui/mesh"]
    for path in pages:
        answer = narrow.goto(base + path)
        assert answer is not None and answer.status == 200, path
        assert narrow.evaluate("document.documentElement.scrollWidth") <= WIDTH, path
        assert narrow.evaluate(OFF_SCREEN) == [], path
        shots.take(narrow, "narrow-" + path.strip("/").replace("/", "-"))
    # The key rows are cards: Rotate and Revoke sit on the screen without any scrolling.
    narrow.goto(f"{base}/ui/projects/{project_id}")
    for name in ("Rotate", "Revoke"):
        button = narrow.get_by_role("button", name=name).first
        button.scroll_into_view_if_needed()
        box = button.bounding_box()
        assert box is not None and 0 <= box["x"] and box["x"] + box["width"] <= WIDTH, name
    narrow.goto(f"{base}/ui/models")
    install = narrow.get_by_role("button", name="Install tev1")
    install.scroll_into_view_if_needed()
    box = install.bounding_box()
    assert box is not None and box["x"] + box["width"] <= WIDTH


def test_the_playground_fits_a_narrow_screen(narrow: Any, stack: Stack) -> None:
    base = signed_in(narrow, stack)
    narrow.goto(f"{base}/ui/models")
    card = narrow.locator("article.card", has=narrow.get_by_role("heading", name="nimble", exact=True))
    card.get_by_text("Playground: ask your own questions").click()
    card.get_by_role("button", name="Run").click()
    card.locator(".playground-result .probability").first.wait_for()
    card.locator(".playground-result details.raw-answer summary").click()
    assert narrow.evaluate("document.documentElement.scrollWidth") <= WIDTH
    assert narrow.evaluate(OFF_SCREEN) == []


def test_a_table_too_wide_for_the_screen_says_so(narrow: Any, stack: Stack) -> None:
    """A table that cannot fold into cards scrolls in its box: a hint above it says so, and the
    box takes the keyboard's focus (arrow keys scroll it); on a wide screen the hint goes."""
    name = "gpu_box_in_the_basement_rack_seven_behind_the_blue_door"  # no place to break it
    with stack.client("admin") as admin:
        body(admin.post("/admin/services", json={"type": "ollama-external", "url": stack.ollama.url, "name": name}),
             201)
    base = signed_in(narrow, stack)
    narrow.goto(f"{base}/ui/services")
    box = narrow.locator(".table-wrap").first
    assert box.evaluate("b => b.scrollWidth > b.clientWidth"), "the services table fits: pick a longer name"
    hint = narrow.locator(".scroll-hint").first
    assert hint.is_visible() and "scroll it sideways" in hint.inner_text()
    assert box.get_attribute("tabindex") == "0" and box.get_attribute("role") == "region"
    assert narrow.evaluate(OFF_SCREEN) == []
    narrow.set_viewport_size({"width": 1280, "height": 800})
    hint.wait_for(state="hidden")
    assert box.get_attribute("tabindex") is None
