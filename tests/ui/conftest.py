"""Web UI fixtures: a signed-in httpx client, and one headless Chromium for the whole session.

The browser is Debian's Chromium (/usr/bin/chromium) driven by Playwright; nothing is
downloaded. Screenshots go to a temporary folder (printed at the end of a run); docs/ui/'s are
made by scripts/screenshots, from a demo-like Arbiter of their own.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from infra_adapters.admin import admin_tls

CHROMIUM = Path("/usr/bin/chromium")
CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def csrf_of(html: str) -> str:
    found = CSRF.search(html)
    assert found, "no CSRF field on the page"
    return found.group(1)


def ui_sign_in(base_url: str, key: str) -> httpx.Client:
    """An httpx client signed in to the UI (it keeps the session cookie)."""
    client = httpx.Client(base_url=base_url, timeout=30, verify=admin_tls())
    form = client.get("/ui/sign-in")
    answer = client.post("/ui/sign-in", data={"csrf": csrf_of(form.text), "key": key})
    assert answer.status_code == 303 and answer.headers["location"] == "/ui/services", answer.text
    return client


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ui-screenshots")


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.skip("browser tests need Debian's Chromium at /usr/bin/chromium "
                    "(apt-get install chromium chromium-driver); .ci/run installs it")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the test extra")
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            yield chromium
        finally:
            chromium.close()


class Shots:
    """Saves screenshots of what a test saw, for a person looking into a failure."""

    def __init__(self, folder: Path, prefix: str) -> None:
        self.folder = folder
        self.prefix = prefix

    def take(self, page: Any, name: str) -> Path:
        path = self.folder / f"{self.prefix}-{name}.png"
        page.screenshot(path=str(path), full_page=False)
        return path


@pytest.fixture
def shots(screenshots: Path, request: pytest.FixtureRequest) -> Shots:
    return Shots(screenshots, request.node.name)


@pytest.fixture
def context(browser: Any) -> Iterator[Any]:
    """A fresh browser profile at 1280x800 (its own cookies), with clipboard access."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    ctx.set_default_timeout(10_000)
    try:
        yield ctx
    finally:
        ctx.close()
