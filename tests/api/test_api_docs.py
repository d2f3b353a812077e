"""The documentation pages (/docs, /redoc, /openapi.json): their scripts served by Arbiter, never
a CDN, and everything under them behind an admin key unless ARBITER_PUBLIC_API_DOCS opens them."""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Callable

import httpx
import pytest

from app.settings import Settings
from tests.support import Gateway, Stack, assert_error
from tests.ui.conftest import ui_sign_in

PAGES = ["/docs", "/redoc", "/openapi.json"]
GATED = [*PAGES, "/docs/assets/swagger-ui-bundle.js", "/docs/assets/swagger-ui.css",
         "/docs/assets/redoc.standalone.js", "/docs/assets/favicon.png", "/docs/oauth2-redirect", "/redoc/x"]
ASSET_URL = re.compile(r'(?:src|href)="([^"]+)"')


def _asset_urls(page: str) -> list[str]:
    return ASSET_URL.findall(page)


@pytest.mark.parametrize("path", GATED)
def test_the_pages_and_their_assets_need_an_admin_key(stack: Stack, path: str) -> None:
    for client in (stack.client(None), stack.client("project"), stack.client("arb_admin_not-a-key")):
        with client:
            assert_error(client.get(path), 401, "authentication_error")


def test_with_an_admin_key_the_pages_load_only_arbiters_own_assets(stack: Stack) -> None:
    with stack.client("admin") as client:
        for page in ("/docs", "/redoc"):
            answer = client.get(page)
            assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/html")
            urls = _asset_urls(answer.text)
            assert urls and all(url.startswith("/docs/assets/") for url in urls), urls
            assert "cdn." not in answer.text and "https://" not in answer.text
            assert "'/openapi.json'" in answer.text or '"/openapi.json"' in answer.text
            for url in urls:  # each one is served, with its type
                asset = client.get(url)
                assert asset.status_code == 200 and len(asset.content) > 1000, url
                assert asset.headers["content-type"].split(";")[0] in ("text/javascript", "text/css", "image/png")
        assert "validatorUrl" in client.get("/docs").text  # no schema sent to swagger.io's validator
        schema = client.get("/openapi.json").json()
        assert "/v1/systemone" in schema["paths"] and "/admin/projects" in schema["paths"]
        assert_error(client.get("/docs/assets/core.py"), 404, "not_found_error")  # nothing else of the package


def test_the_setting_opens_them_to_anyone(stack: Stack, gateway_factory: Callable[..., Gateway]) -> None:
    assert Settings(public_api_docs=True).public_api_docs and not Settings().public_api_docs
    public = gateway_factory(public_api_docs=True)
    with httpx.Client(base_url=public.url) as client:
        for path in [*PAGES, "/docs/assets/swagger-ui-bundle.js"]:
            assert client.get(path).status_code == 200, path
        assert_error(client.get("/docs/nothing-here"), 404, "not_found_error")
        assert_error(client.get("/admin/projects"), 401)  # the API itself is as closed as ever


UI_DOCS = ["/ui/api-docs", "/ui/api-docs/redoc", "/ui/api-docs/openapi.json", "/ui/api-docs/assets/swagger-ui.css"]


def test_a_signed_in_ui_admin_reads_the_pages_under_ui_and_nobody_else(stack: Stack) -> None:
    """A browser sends no Authorization header: behind the UI session (cookie path /ui) the same
    pages are at /ui/api-docs; without a session they send the browser to sign in."""
    with httpx.Client(base_url=stack.gateway.url, timeout=30) as anonymous:
        for path in UI_DOCS:
            answer = anonymous.get(path)
            assert answer.status_code == 303 and answer.headers["location"].startswith("/ui/sign-in"), path
    client = ui_sign_in(stack.gateway.url, stack.admin_key)
    try:
        page = client.get("/ui/api-docs")
        assert page.status_code == 200
        urls = _asset_urls(page.text)
        assert urls and all(url.startswith("/ui/api-docs/assets/") for url in urls), urls
        assert "'/ui/api-docs/openapi.json'" in page.text
        assert all(client.get(url).status_code == 200 for url in urls)
        assert "/admin/projects" in client.get("/ui/api-docs/openapi.json").json()["paths"]
    finally:
        client.close()


def test_the_pages_let_only_their_own_inline_script_run(stack: Stack) -> None:
    """The policy names the start-up script's hash: a script the page does not carry (one a
    schema could smuggle in) has no hash in it, and no 'unsafe-inline' opens scripts."""
    with stack.client("admin") as client:
        page = client.get("/docs")
    policy = page.headers["content-security-policy"]
    (inline,) = re.findall(r"<script>(.*?)</script>", page.text, re.DOTALL)
    digest = base64.b64encode(hashlib.sha256(inline.encode()).digest()).decode()
    scripts = next(part for part in policy.split(";") if part.strip().startswith("script-src"))
    assert f"'sha256-{digest}'" in scripts and "unsafe-inline" not in scripts
    assert "frame-ancestors 'none'" in policy
