"""Swagger UI's Authorize in Chromium: the OpenAPI document declares the keys each operation
takes (app/api/openapi.py), so the page offers them, marks the operations that need one with a
lock and the public ones without, and a key given there goes with "Try it out"."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import Stack


@pytest.fixture
def page(context: Any) -> Iterator[Any]:
    tab = context.new_page()
    yield tab
    tab.close()


def operation(page: Any, method: str, path: str) -> Any:
    """An operation's block on the page: its method and path, exactly."""
    return page.locator(f".opblock-{method.lower()}").filter(
        has=page.locator(f".opblock-summary-path[data-path='{path}']")).first


def test_authorize_offers_the_keys_and_try_it_out_sends_the_admin_key(page: Any, stack: Stack) -> None:
    base = stack.gateway.url
    page.goto(f"{base}/ui/sign-in")  # a browser sends no bearer header: the UI's copy of the pages
    page.get_by_label("Admin key").fill(stack.admin_key)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{base}/ui/services")
    page.goto(f"{base}/ui/api-docs")
    projects = operation(page, "GET", "/admin/projects")
    projects.wait_for(timeout=20000)
    assert projects.locator(".authorization__btn").count() == 1  # the lock: it takes a key
    assert operation(page, "GET", "/healthz").locator(".authorization__btn").count() == 0
    assert operation(page, "POST", "/v1/systemone").locator(".authorization__btn").count() == 1

    page.locator(".auth-wrapper .authorize").click()
    dialog = page.locator(".dialog-ux .modal-ux")
    offered = dialog.locator(".auth-container h4").all_inner_texts()
    assert [" ".join(text.split()) for text in offered] == [
        "projectKey (http, Bearer)", "adminKey (http, Bearer)", "meshCredential (apiKey)"], offered
    admin = dialog.locator(".auth-container").filter(has_text="adminKey")
    admin.locator("input").fill(stack.admin_key)
    admin.get_by_role("button", name="Apply credentials").click()
    assert admin.get_by_role("button", name="Remove authorization").is_visible()  # applied
    dialog.get_by_role("button", name="Close").first.click()

    projects.locator(".opblock-summary").click()
    projects.get_by_role("button", name="Try it out").click()
    projects.get_by_role("button", name="Execute").click()
    status = projects.locator(".live-responses-table .response .response-col_status").first
    status.wait_for(timeout=20000)
    assert status.inner_text().strip() == "200"
    assert "acme" in projects.locator(".live-responses-table").inner_text()  # the answer, with the key sent
