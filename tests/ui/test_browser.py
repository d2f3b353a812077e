"""The web UI in a real headless Chromium: an operator's whole walk through it, the keyboard,
and a phone-sized screen."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from app.db.session import Database
from infra_adapters.emulators.ollama import OllamaState, make_ollama_app
from infra_adapters.emulators.server import EmulatorServer
from tests.routing.strategies.test_answer_warnings import QWEN
from tests.routing.strategies.test_answer_warnings import _stack as labels_stack
from tests.support import Gateway, Stack, decision
from tests.ui.conftest import Shots

PAGES = ("/ui/services", "/ui/models", "/ui/projects", "/ui/usage", "/ui/audit", "/ui/mesh")


@pytest.fixture
def page(context: Any) -> Iterator[Any]:
    tab = context.new_page()
    tab.on("dialog", lambda dialog: dialog.accept())  # the confirm() before Remove and Revoke
    yield tab
    tab.close()


def sign_in(page: Any, base: str, key: str) -> None:
    page.goto(f"{base}/ui/sign-in")
    page.get_by_label("Admin key").fill(key)
    page.get_by_role("button", name="Sign in").click()


def test_an_operator_walks_through_the_ui(page: Any, context: Any, db: Database, shots: Shots,
                                          gateway_factory: Callable[..., Gateway]) -> None:
    own = OllamaState(models={}, pull_seconds=1.5)
    with EmulatorServer(make_ollama_app(own)) as ollama:
        stack = Stack.provision(db)  # an admin key (and a project 'acme' we do not need here)
        base = gateway_factory().url

        # Not signed in: every page sends us to the sign-in form.
        page.goto(f"{base}/ui/models")
        assert page.url == f"{base}/ui/sign-in"
        shots.take(page, "sign-in")

        # A project key is refused, next to the form.
        sign_in(page, base, stack.project_key)
        alert = page.locator("#sign-in-error")
        assert "project key" in alert.inner_text() and page.url == f"{base}/ui/sign-in"
        assert page.locator("#sign-in-key").get_attribute("aria-invalid") == "true"
        sign_in(page, base, stack.admin_key)
        page.wait_for_url(f"{base}/ui/services")
        cookie = next(c for c in context.cookies() if c["name"] == "arbiter_ui")
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/ui"
        assert page.evaluate("document.cookie") == ""  # invisible to scripts

        # Add the emulated Ollama as the deployment's own.
        page.get_by_label("Type", exact=True).select_option("ollama")
        page.get_by_label("URL", exact=True).fill(ollama.url)
        page.get_by_label("Name (optional)").fill("gpu-box")
        page.get_by_role("button", name="Add service").click()
        page.wait_for_url(f"{base}/ui/services?done=added")
        row = page.locator("tr", has_text="gpu-box")
        assert "reachable" in row.inner_text() and "0.35.0" in row.inner_text()
        shots.take(page, "services")

        # Install tev1 from the catalog and watch its progress bar reach 100%.
        page.get_by_role("link", name="Models").click()
        catalog_row = page.locator("table.catalog tr", has_text="tev1")
        catalog_row.get_by_role("button", name="Install tev1").click()
        page.wait_for_url(re.compile(r".*/ui/models\?install=\d+"))
        bar = page.locator("li.install progress").first
        seen: list[float] = []
        deadline = time.monotonic() + 15
        while not seen or seen[-1] < 100:
            assert time.monotonic() < deadline, seen
            seen.append(float(bar.evaluate("b => b.value")))
            time.sleep(0.05)
        assert any(0 < value < 100 for value in seen), seen  # it moved while the pull ran
        item = page.locator("li.install").first
        assert item.locator('[data-field="status"]').inner_text() == "succeeded"
        assert item.locator('[data-field="percent"]').inner_text() == "100%"
        shots.take(page, "install-done")
        item.get_by_role("link", name="Installed: see its card").click()

        # Its card: type, capabilities, service, public name; Test shows the choice and every probability.
        card = page.locator("article.card", has=page.get_by_role("heading", name="tev1"))
        assert "decision" in card.inner_text() and "gpu-box" in card.inner_text()
        card.get_by_role("button", name="Test").click()
        choice = card.locator(".test-result .choice")
        choice.wait_for()
        assert choice.inner_text() in ("billing", "shipping", "security")
        options = card.locator(".test-result .probability")
        assert options.count() == 3
        assert sorted(options.nth(i).get_attribute("data-option") for i in range(3)) == \
            ["billing", "security", "shipping"]
        total = sum(float(options.nth(i).locator("progress").evaluate("b => b.value")) for i in range(3))
        assert abs(total - 1.0) < 1e-3
        shots.take(page, "models")

        # A project that may use tev1, and a key for it, shown once with a copy button.
        page.get_by_role("link", name="Projects").click()
        page.get_by_label("Name", exact=True).fill("support")
        page.get_by_label("Only these:").check()
        page.get_by_label("tev1").check()
        page.get_by_role("button", name="Create project").click()
        page.wait_for_url(re.compile(r".*/ui/projects/\d+\?done=created"))
        project_url = page.url.split("?")[0]
        page.locator("#key-name").fill("ci")
        page.get_by_role("button", name="Create key").click()
        key = page.locator("#new-key-value").input_value()
        assert re.fullmatch(r"arb_proj_[0-9A-Za-z]{43}", key)
        context.grant_permissions(["clipboard-read", "clipboard-write"], origin=base)
        page.get_by_role("button", name="Copy").click()
        page.wait_for_function("document.querySelector('.copy-row .copied').textContent !== ''")
        assert page.locator(".copy-row .copied").inner_text() == "Copied."
        assert page.evaluate("navigator.clipboard.readText()") == key
        shots.take(page, "new-key")

        # The key works for a real decision, and only for what the allowlist says.
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=30) as tenant:
            assert tenant.post("/v1/systemone", json=decision("tev1")).status_code == 200
            assert tenant.post("/v1/systemone", json=decision("nimble")).status_code == 403

            # Later, only its prefix and last four are shown; revoke it, and the next request gets 401.
            page.goto(project_url)
            assert key not in page.content()
            key_row = page.locator("tr", has_text=f"{key[:13]}…{key[-4:]}")
            key_row.get_by_role("button", name=re.compile("Revoke")).click()
            page.wait_for_url(f"{project_url}?done=revoked")
            assert "revoked" in page.locator("tr", has_text=f"{key[:13]}…{key[-4:]}").inner_text()
            assert tenant.post("/v1/systemone", json=decision("tev1")).status_code == 401

        # Usage: the decision is on the chart and in the recent requests.
        recent = page.locator("section", has_text="Recent requests").locator("tbody tr")
        deadline = time.monotonic() + 15  # generous: a loaded host (CI runs two passes at once)
        while True:  # the usage ledger writes in batches, off the request path
            page.goto(f"{base}/ui/usage?project=support")
            if recent.count() == 2 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert recent.count() == 2  # the 200 and the 403
        assert page.locator("#tokens-chart rect").count() == 1
        assert "tev1" in page.locator("#tokens-chart .legend").inner_text()
        shots.take(page, "usage")

        page.get_by_role("link", name="Audit log").click()
        audit = page.locator("table.audit").inner_text()
        for action in ("service.create", "model.install", "project.create", "project_key.create", "key.revoke"):
            assert action in audit, action
        shots.take(page, "audit")
        page.get_by_role("link", name="Mesh").click()
        assert "This node is standalone" in page.locator("main").inner_text()
        shots.take(page, "mesh")

        # A POST without the CSRF token is refused, even with the session cookie.
        refused = page.request.post(f"{base}/ui/projects", form={"name": "forged", "scope": "all"})
        assert refused.status == 403 and "security token" in refused.text()
        assert "forged" not in httpx.get(f"{base}/admin/projects",
                                         headers={"Authorization": f"Bearer {stack.admin_key}"}).text

        # Sign out: back to the form, and the pages are closed again.
        page.get_by_role("button", name="Sign out").click()
        page.wait_for_url(f"{base}/ui/sign-in")
        page.goto(f"{base}/ui/services")
        assert page.url == f"{base}/ui/sign-in"


def test_cancel_stops_a_running_install(page: Any, db: Database, gateway_factory: Callable[..., Gateway]) -> None:
    own = OllamaState(models={}, pull_seconds=30)
    with EmulatorServer(make_ollama_app(own)) as ollama:
        stack = Stack.provision(db)
        base = gateway_factory().url
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {stack.admin_key}"}) as admin:
            assert admin.post("/admin/services", json={"type": "ollama", "url": ollama.url,
                                                       "name": "own"}).status_code == 201
        sign_in(page, base, stack.admin_key)
        page.goto(f"{base}/ui/models")
        page.locator("table.catalog tr", has_text="nimble-v3").get_by_role("button", name="Install nimble-v3").click()
        item = page.locator("li.install").first
        item.get_by_role("button", name="Cancel install").click()
        page.wait_for_url(f"{base}/ui/models?done=cancelled")
        assert page.locator("li.install").first.locator('[data-field="status"]').inner_text() == "cancelled"
        assert "nimble-v3" not in page.locator("#cards").inner_text()


def test_sign_in_with_the_keyboard_alone(page: Any, stack: Stack) -> None:
    base = stack.gateway.url
    page.goto(f"{base}/ui/sign-in")
    page.evaluate("document.activeElement && document.activeElement.blur()")
    for _ in range(6):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.id") == "sign-in-key":
            break
    assert page.evaluate("document.activeElement.id") == "sign-in-key"
    outline = page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    assert outline not in ("none", "")  # focus is visible
    page.keyboard.type(stack.admin_key)
    page.keyboard.press("Enter")
    page.wait_for_url(f"{base}/ui/services")
    # The main navigation is reachable with Tab and opens with Enter.
    for _ in range(10):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.textContent") == "Projects":
            break
    page.keyboard.press("Enter")
    page.wait_for_url(f"{base}/ui/projects")


def test_pages_fit_a_narrow_screen(browser: Any, stack: Stack, shots: Shots) -> None:
    context = browser.new_context(viewport={"width": 390, "height": 844})
    try:
        page = context.new_page()
        base = stack.gateway.url
        page.goto(f"{base}/ui/sign-in")
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        sign_in(page, base, stack.admin_key)
        page.wait_for_url(f"{base}/ui/services")
        for path in (*PAGES, "/ui/projects/1", "/ui/services/1"):
            page.goto(base + path)
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= 390, (path, width)
            shots.take(page, "narrow-" + path.strip("/").replace("/", "-"))
    finally:
        context.close()


def open_models_page(page: Any, db: Database, gateway_factory: Callable[..., Gateway], ollama_url: str) -> str:
    """A gateway in front of ``ollama_url``, signed in, on /ui/models; its base URL."""
    stack = Stack.provision(db, ollama_url=ollama_url)
    base = gateway_factory().url
    sign_in(page, base, stack.admin_key)
    page.wait_for_url(f"{base}/ui/services")
    page.goto(f"{base}/ui/models")
    return base


def test_an_error_far_down_the_models_page_is_summed_up_at_the_top(
        page: Any, db: Database, gateway_factory: Callable[..., Gateway]) -> None:
    """The version gate's refusal sits next to the catalog row, far below the fold: the page comes
    back at the top, so a summary there takes the focus and links down to it."""
    with EmulatorServer(make_ollama_app(OllamaState(version="0.34.9", models={}))) as ollama:
        open_models_page(page, db, gateway_factory, ollama.url)
        page.get_by_role("button", name="Install tev1").click()
        page.wait_for_load_state()
        summary = page.locator("#error-summary")
        assert "Decision models need Ollama 0.35.0 or newer" in summary.inner_text()
        assert page.evaluate("document.activeElement.id") == "error-summary"
        box = summary.bounding_box()
        assert box is not None and 0 <= box["y"] < 800  # on screen, not 2,900 px down
        link = summary.get_by_role("link")
        target = link.get_attribute("href")
        assert target is not None and page.locator(target).count() == 1  # leads to the error by its form
        link.click()
        assert page.locator(target).is_visible() and page.url.endswith(target)


def test_the_installed_link_shows_the_new_card_from_a_plain_models_page(
        page: Any, db: Database, gateway_factory: Callable[..., Gateway]) -> None:
    """On /ui/models (no query), a link to /ui/models#cards only scrolled: the new card never came."""
    with EmulatorServer(make_ollama_app(OllamaState(models={}, pull_seconds=1.5))) as ollama:
        base = open_models_page(page, db, gateway_factory, ollama.url)
        page.get_by_role("button", name="Install tev1").click()
        page.wait_for_url(re.compile(r".*/ui/models\?install=\d+"))
        page.goto(f"{base}/ui/models")  # the plain page, the install still running
        link = page.locator("li.install").first.get_by_role("link", name="Installed: see its card")
        link.wait_for(state="visible", timeout=15_000)
        link.click()
        page.get_by_role("heading", name="tev1", exact=True).wait_for()
        assert "Model installed; its card is below." in page.locator(".notice").inner_text()


def test_a_failed_form_on_the_project_and_services_pages_is_summed_up_at_the_top(
        page: Any, db: Database, gateway_factory: Callable[..., Gateway]) -> None:
    """Every form page shows the summary the Models page has: it takes the focus and links to the
    reason beside the form."""
    stack = Stack.provision(db)
    base = gateway_factory().url
    sign_in(page, base, stack.admin_key)
    page.wait_for_url(f"{base}/ui/services")

    page.goto(f"{base}/ui/projects/1")
    page.get_by_label("Requests per minute").fill("-5")
    page.get_by_role("button", name="Save limits").click()
    page.wait_for_load_state()
    summary = page.locator("#error-summary")
    reason = page.locator("#limits-error").inner_text()
    assert reason and reason in summary.inner_text()
    assert page.evaluate("document.activeElement.id") == "error-summary"
    summary.get_by_role("link").click()
    assert page.url.endswith("#limits-error") and page.locator("#limits-error").is_visible()

    page.goto(f"{base}/ui/services")
    page.get_by_label("Type", exact=True).select_option("ollama-external")
    page.get_by_label("URL", exact=True).fill("ftp://nowhere")
    page.get_by_role("button", name="Add service").click()
    page.wait_for_load_state()
    reason = page.locator("#add-service-error").inner_text()
    assert reason and reason in page.locator("#error-summary").inner_text()
    assert page.evaluate("document.activeElement.id") == "error-summary"
    assert page.locator("#error-summary a").get_attribute("href") == "#add-service-error"


def test_the_api_docs_render_in_the_browser_under_their_policy(page: Any, stack: Stack) -> None:
    """Swagger UI's bundle and its start-up script run under the page's Content-Security-Policy
    (a wrong hash would leave the page blank) and list the admin routes, for a signed-in admin."""
    base = stack.gateway.url
    refused: list[str] = []
    page.on("console", lambda m: refused.append(m.text) if "Content Security Policy" in m.text else None)
    sign_in(page, base, stack.admin_key)
    page.wait_for_url(f"{base}/ui/services")
    page.goto(f"{base}/ui/api-docs")
    page.get_by_text("/admin/projects", exact=True).first.wait_for(timeout=20000)
    assert not refused, refused


def test_a_failed_reading_shows_its_warning_under_the_test_result(
        page: Any, db: Database, vllm: Any, gateway_factory: Callable[..., Gateway]) -> None:
    """The model card's Test draws a low_label_mass warning (arbiter.js), not only its JSON."""
    stack = labels_stack(db, vllm, gateway_factory, label_mass_warning=0.6)
    stack.extra["state"].label_mass = 0.4
    base = stack.gateway.url
    sign_in(page, base, stack.admin_key)
    page.wait_for_url(f"{base}/ui/services")
    page.goto(f"{base}/ui/models")
    card = page.locator("article.card", has=page.get_by_role("heading", name=QWEN))
    card.get_by_role("button", name="Test").click()
    warning = card.locator('.test-result p.warning[data-code="low_label_mass"]').first
    warning.wait_for(timeout=20000)
    assert "low_label_mass" in warning.inner_text()
