"""The model card's playground and the audit log's filters in a real headless Chromium: the
answer's bars drawn by arbiter.js, a refusal and a backend's error shown readably, the filters
and the cell links of the audit log."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.support import Stack, body
from tests.ui.test_browser import sign_in

QUESTIONS = {"channel": {"type": "choice", "instructions": "Where did this come from?",
                         "criteria": {"email": "an email", "phone": "a phone call", "chat": None, "letter": None}},
             "refund": {"type": "noul", "instructions": "Does the customer want money back?"}}


@pytest.fixture
def page(context: Any) -> Iterator[Any]:
    tab = context.new_page()
    yield tab
    tab.close()


def nimble_card(page: Any, stack: Stack) -> Any:
    base = stack.gateway.url
    sign_in(page, base, stack.admin_key)
    page.wait_for_url(f"{base}/ui/services")
    page.goto(f"{base}/ui/models")
    card = page.locator("article.card", has=page.get_by_role("heading", name="nimble", exact=True))
    card.get_by_text("Playground: ask your own questions").click()
    return card


def test_the_playground_draws_each_questions_bars(page: Any, stack: Stack) -> None:
    card = nimble_card(page, stack)
    wide = card.bounding_box()
    assert wide is not None and wide["width"] > 900  # open, it takes the card's whole row
    card.get_by_label("State").fill('{"ticket": "I want my money back for the broken kettle", "via": "email"}')
    card.get_by_label("Questions (JSON)").fill(json.dumps(QUESTIONS, indent=2))
    card.get_by_role("button", name="Run").click()
    result = card.locator(".playground-result")
    result.locator(".probability").first.wait_for()
    parts = result.locator("section.playground-question")
    assert [parts.nth(i).get_attribute("data-question") for i in range(parts.count())] == ["channel", "refund"]
    channel = parts.nth(0).locator(".probability")
    assert [channel.nth(i).get_attribute("data-option") for i in range(channel.count())] == [
        "email", "phone", "chat", "letter"]
    values = [float(channel.nth(i).locator("progress").evaluate("b => b.value")) for i in range(4)]
    assert sum(values) == pytest.approx(1, abs=1e-3)
    chosen = parts.nth(0).locator(".value").inner_text()
    assert chosen in QUESTIONS["channel"]["criteria"]
    assert channel.nth(values.index(max(values))).locator("span.chosen").inner_text() == chosen
    refund = parts.nth(1).locator(".probability")
    assert [refund.nth(i).get_attribute("data-option") for i in range(2)] == ["true", "false"]
    assert "input tokens" in result.locator(".usage").inner_text()
    result.locator("details.raw-answer summary").click()
    raw = json.loads(result.locator("pre.json").inner_text())
    assert raw["model"] == "nimble" and list(raw["answers"]) == ["channel", "refund"]
    [seen] = [r for r in stack.ollama_state.requests if r.path == "/v1/systemone"]
    assert seen.json["state"] == {"ticket": "I want my money back for the broken kettle", "via": "email"}


def test_the_playground_shows_bad_input_and_a_backends_error(page: Any, stack: Stack) -> None:
    card = nimble_card(page, stack)
    result = card.locator(".playground-result")
    card.get_by_label("Questions (JSON)").fill('{"q": {"type": "score", "criteria": ["only one level"]}}')
    card.get_by_role("button", name="Run").click()
    refusal = result.locator(".error-text")
    refusal.wait_for()
    assert refusal.inner_text().startswith("Not run (400): questions.q.criteria")
    stack.ollama_state.faults.status = 500
    stack.ollama_state.faults.body = b'{"error":"model runner has unexpectedly stopped"}'
    card.get_by_label("Questions (JSON)").fill(json.dumps(QUESTIONS))
    card.get_by_role("button", name="Run").click()
    failure = result.locator(".error-text", has_text="(500)")
    failure.wait_for()  # the page's policy allows no eval: wait on a locator, not a function
    shown = failure.inner_text()
    assert shown.startswith("The backend answered with an error (500)")
    assert "model runner has unexpectedly stopped" in shown


def test_the_audit_log_filters_and_its_links(page: Any, stack: Stack) -> None:
    with stack.client("admin") as admin:
        for name in ("north", "south"):
            body(admin.post("/admin/projects", json={"name": name}), 201)
        body(admin.patch("/admin/projects/north", json={"requests_per_minute": 9}), 200)
        body(admin.post("/admin/projects/north/keys", json={"name": "ci"}), 201)
    base = stack.gateway.url
    sign_in(page, base, stack.admin_key)
    page.wait_for_url(f"{base}/ui/services")
    page.get_by_role("link", name="Audit log").click()
    page.get_by_label("Action").fill("project")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url(re.compile(r".*/ui/audit\?.*action=project"))
    actions = page.locator("table.audit td[data-label=Action]").all_inner_texts()
    assert actions and all(a.startswith("project.") for a in actions), actions
    assert "project.update" in actions and "project_key.create" not in actions
    assert "requests_per_minute: 9" in page.locator("table.audit").inner_text()  # key: value, not a repr
    # A target's link narrows the filter in use; Clear shows everything again.
    page.locator("table.audit").get_by_role("link", name="project:north", exact=True).first.click()
    page.wait_for_url(re.compile(r".*target=project%3Anorth.*"))
    query = parse_qs(urlsplit(page.url).query)
    assert query == {"action": ["project"], "target": ["project:north"]}
    assert page.locator("table.audit td[data-label=Action]").all_inner_texts() == ["project.update", "project.create"]
    assert page.get_by_label("Target").input_value() == "project:north"
    page.get_by_role("link", name="Clear the filters").click()
    page.wait_for_url(f"{base}/ui/audit")
    assert "project_key.create" in page.locator("table.audit").inner_text()
