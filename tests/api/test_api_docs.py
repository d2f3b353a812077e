"""The documentation pages (/docs, /redoc, /openapi.json): their scripts served by Arbiter, never
a CDN, and everything under them behind an admin key unless ARBITER_PUBLIC_API_DOCS opens them."""

from __future__ import annotations

import re
from collections.abc import Callable

import httpx
import pytest

from app.settings import Settings
from tests.support import Gateway, Stack, assert_error

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
