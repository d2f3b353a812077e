"""More than one Authorization header is a 400 on every route, before any key is looked up: the
lean routes took the last and FastAPI's the first, so a proxy adding a header could pick the key."""

from __future__ import annotations

import httpx
import pytest

from tests.support import Stack, assert_error, decision

ROUTES = [("POST", "/v1/systemone"), ("POST", "/v1/chat/completions"), ("GET", "/v1/models"),
          ("GET", "/admin/projects"), ("GET", "/ui/services"), ("GET", "/metrics"), ("GET", "/openapi.json")]


def _send(stack: Stack, method: str, path: str, keys: list[str]) -> httpx.Response:
    headers = [("Authorization", f"Bearer {key}") for key in keys]
    with stack.gateway.client() as client:
        body = decision() if method == "POST" else None
        return client.request(method, path, headers=headers, json=body)


@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_two_authorization_headers_are_refused_on_every_route(stack: Stack, method: str, path: str) -> None:
    key = stack.admin_key if not path.startswith("/v1/") else stack.project_key
    for keys in ([key, key], ["arb_not-a-key", key], [key, "arb_not-a-key"]):
        response = _send(stack, method, path, keys)
        body = assert_error(response, 400, "invalid_request_error")
        assert body["error"].startswith("more than one Authorization header")
        assert "arb_" not in response.text  # no key echoed
        assert response.headers["connection"] == "close" and response.headers["x-request-id"]


def test_one_authorization_header_still_opens_the_routes(stack: Stack) -> None:
    assert _send(stack, "POST", "/v1/systemone", [stack.project_key]).status_code == 200
    assert _send(stack, "GET", "/admin/projects", [stack.admin_key]).status_code == 200
    assert _send(stack, "GET", "/metrics", [stack.admin_key]).status_code == 200
