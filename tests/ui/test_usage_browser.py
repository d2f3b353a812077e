"""The usage pages in a real headless Chromium: the three charts drawn, the drill-down filtered and
followed to one request, a request found by its id, the CSV downloaded, and every page on a
390 px wide screen with no control off-screen."""

from __future__ import annotations

import csv
import datetime as dt
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import Stack
from tests.ui.conftest import Shots
from tests.ui.test_browser import sign_in
from tests.ui.test_usage_pages import add_usage, ids_of

PHONE = {"width": 390, "height": 844}


@pytest.fixture
def page(context: Any) -> Iterator[Any]:
    tab = context.new_page()
    yield tab
    tab.close()


def some_usage(stack: Stack) -> None:
    """Three days of acme's requests: answered, rate-limited and failed, fast and slow."""
    now = dt.datetime.now(dt.UTC)
    for days, count in ((2, 30), (1, 50), (0, 80)):
        add_usage(stack, "acme", count, at=now - dt.timedelta(days=days, seconds=5),
                  status=[(200, 200, 200, 429, 503)[i % 5] for i in range(count)],
                  latency_ms=[5.0 + (i * 37) % 400 for i in range(count)],
                  request_id=[f"d{days}-{i}" for i in range(count)], model=["nimble", "tev1"][days % 2])


def test_the_charts_and_the_drill_down(page: Any, stack: Stack, shots: Shots, tmp_path: Path) -> None:
    some_usage(stack)
    base = stack.gateway.url
    sign_in(page, base, stack.admin_key)
    page.wait_for_url(f"{base}/ui/services")
    page.get_by_role("link", name="Usage", exact=True).click()
    page.get_by_label("Project", exact=True).select_option("acme")
    page.get_by_role("button", name="Show").click()
    page.wait_for_url(re.compile(r".*/ui/usage\?project=acme.*"))
    assert page.locator("#tokens-chart rect").count() == 3  # a model a day
    assert page.locator("#latency-chart polyline").count() == 2  # p50 and p95 over three days
    assert page.locator("#latency-chart circle").count() == 6
    assert page.locator("#status-chart rect.status-5xx").count() == 3
    for chart in ("#tokens-chart", "#latency-chart", "#status-chart"):
        box = page.locator(f"{chart} svg").bounding_box()
        assert box is not None and box["width"] > 600 and box["height"] > 150, chart
    assert "p95:" in page.locator("#latency-chart .legend").inner_text()
    assert "5xx: 32 (20.0 %)" in page.locator("#status-chart .legend").inner_text()
    shots.take(page, "usage-charts")

    # The drill-down, filtered to the failures, then one request.
    page.get_by_role("link", name="Every request, with filters and a CSV download").click()
    page.get_by_label("Status", exact=True).select_option("5xx")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url(re.compile(r".*status=5xx.*"))
    rows = page.locator("table.requests tbody tr")
    assert rows.count() == 32
    assert set(page.locator("table.requests .badge").all_inner_texts()) == {"503"}
    shots.take(page, "usage-requests")
    with page.expect_download() as caught:
        page.get_by_role("link", name="Download every request that matches (CSV)").click()
    saved = tmp_path / caught.value.suggested_filename
    caught.value.save_as(saved)
    assert saved.name.startswith("arbiter-requests-acme-") and saved.suffix == ".csv"
    with saved.open(encoding="utf-8", newline="") as file:
        assert len(list(csv.reader(file))) == 1 + 32
    first = rows.first.locator("a").first
    wanted = first.inner_text()
    first.click()
    page.wait_for_url(re.compile(r".*/ui/usage/request\?id=.*"))
    facts = page.locator("section.request dl").inner_text()
    assert wanted in facts and "Status\n503" in facts and "Backend\nollama" in facts
    shots.take(page, "usage-request")

    # A request id pasted into the search box.
    page.goto(f"{base}/ui/usage")
    page.get_by_label("Request id").fill("  d1-7 ")
    page.get_by_role("button", name="Find").click()
    page.wait_for_url(re.compile(r".*/ui/usage/request\?id=.*"))
    assert page.get_by_role("heading", level=1).inner_text().split() == ["Request", "d1-7"]
    assert "ollama" in page.locator("section.request dl").inner_text()

    # By key, and on to that key's requests.
    page.get_by_role("link", name="Requests", exact=True).first.click()
    page.get_by_role("link", name="By key").click()
    page.get_by_label("Project", exact=True).select_option("acme")
    page.get_by_role("button", name="Show").click()
    key_id = ids_of(stack)["acme/"]
    row = page.locator(f"#usage-key-{key_id}")
    assert row.locator("td").nth(3).inner_text() == "160"
    row.get_by_role("link", name=re.compile("Requests with key")).click()
    page.wait_for_url(re.compile(rf".*key={key_id}.*"))
    assert (page.locator("table.requests tbody tr").count() == 50
            and page.get_by_role("link", name="Older requests").count() == 1)


def test_the_usage_pages_fit_a_phone(browser: Any, stack: Stack, shots: Shots) -> None:
    some_usage(stack)
    key_id = ids_of(stack)["acme/"]
    context = browser.new_context(viewport=PHONE)
    try:
        page = context.new_page()
        base = stack.gateway.url
        sign_in(page, base, stack.admin_key)
        page.wait_for_url(f"{base}/ui/services")
        for path in ("/ui/usage?project=acme", "/ui/usage?days=1", "/ui/usage/keys?project=acme",
                     f"/ui/usage/requests?project=acme&key={key_id}", "/ui/usage/requests?status=teapot",
                     "/ui/usage/request?id=d0-3"):
            page.goto(base + path)
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= PHONE["width"], (path, width)
            controls = page.locator("header a, header button, main a, main button, main input, main select")
            assert controls.count() > 5, path
            for index in range(controls.count()):
                control = controls.nth(index)
                if not control.is_visible():
                    continue
                box = control.bounding_box()
                assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"] + 0.5, \
                    (path, control.evaluate("e => e.outerHTML.slice(0, 120)"), box)
            shots.take(page, "narrow-" + re.sub(r"[^a-z0-9]+", "-", path.lower()).strip("-"))
    finally:
        context.close()
