"""The API's documentation pages: Swagger UI at ``/docs``, ReDoc at ``/redoc`` and the schema at
``/openapi.json``.

FastAPI's own pages load their scripts from a CDN without integrity checks: whoever serves that
file runs code in an admin's browser on this origin. Here the scripts come from the
``fastapi-offline`` package (Swagger UI and ReDoc, as released) and are served by Arbiter at
``/docs/assets/``. The schema lists every admin route, so the pages, the schema and the assets
(everything under ``/docs`` and ``/redoc``) take an admin key unless ``ARBITER_PUBLIC_API_DOCS``
opens them. A browser cannot send an admin key, so a signed-in web UI admin reads the same
pages at ``/ui/api-docs`` (app/ui/docs_pages.py), behind the UI session instead.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import re
from importlib.resources import files

from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import JSONResponse

from app.api.deps import components
from app.errors import NotFound

DOCS_PATH, REDOC_PATH, OPENAPI_PATH = "/docs", "/redoc", "/openapi.json"
ASSETS_PATH = f"{DOCS_PATH}/assets"
ASSETS = files("fastapi_offline") / "static"
ASSET_TYPES = {"swagger-ui-bundle.js": "text/javascript; charset=utf-8", "swagger-ui.css": "text/css; charset=utf-8",
               "redoc.standalone.js": "text/javascript; charset=utf-8", "favicon.png": "image/png"}
# No call to swagger.io's validator (Swagger UI's default sends it the schema's URL).
SWAGGER_PARAMETERS = {"validatorUrl": None}
PAGE_HEADERS = {"X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY", "Cache-Control": "no-store"}
_INLINE_SCRIPT = re.compile(rb"<script>(.*?)</script>", re.DOTALL)
# Scripts: the served bundles and the page's own inline start-up script, by its hash; styles inline
# too (both bundles set style attributes, ReDoc injects <style>); ReDoc's search runs in a blob worker.
_POLICY = ("default-src 'self'; script-src 'self'{hashes}; style-src 'self' 'unsafe-inline'; "
           "img-src 'self' data:; worker-src 'self' blob:; connect-src 'self'; frame-ancestors 'none'; "
           "base-uri 'none'; form-action 'self'")


async def admin_key(request: Request) -> None:
    """401 without an admin key (any role: the pages only read)."""
    await components(request).keys.authenticate(request.headers.get("authorization"), "admin")


def swagger_page(app: FastAPI, request: Request, openapi_url: str, assets: str) -> Response:
    root = request.scope.get("root_path", "")
    page = get_swagger_ui_html(openapi_url=root + openapi_url, title=f"{app.title} - Swagger UI",
                               swagger_js_url=f"{root}{assets}/swagger-ui-bundle.js",
                               swagger_css_url=f"{root}{assets}/swagger-ui.css",
                               swagger_favicon_url=f"{root}{assets}/favicon.png",
                               swagger_ui_parameters=SWAGGER_PARAMETERS)
    return _secured(page)


def redoc_page(app: FastAPI, request: Request, openapi_url: str, assets: str) -> Response:
    root = request.scope.get("root_path", "")
    page = get_redoc_html(openapi_url=root + openapi_url, title=f"{app.title} - ReDoc",
                          redoc_js_url=f"{root}{assets}/redoc.standalone.js",
                          redoc_favicon_url=f"{root}{assets}/favicon.png", with_google_fonts=False)
    return _secured(page)


def _secured(page: Response) -> Response:
    """The page with its headers and a Content-Security-Policy that lets only its own inline
    script run (by hash), so nothing injected into the page (say, through the schema) would."""
    hashes = "".join(f" 'sha256-{base64.b64encode(hashlib.sha256(script).digest()).decode()}'"
                     for script in _INLINE_SCRIPT.findall(bytes(page.body)))
    page.headers.update(PAGE_HEADERS)
    page.headers["Content-Security-Policy"] = _POLICY.format(hashes=hashes)
    return page


def asset(name: str) -> Response:
    """One of the files named in ASSET_TYPES: nothing else of the package is served."""
    kind = ASSET_TYPES.get(name)
    if kind is None:
        raise NotFound(f"no documentation asset '{name}'")
    return Response(_asset(name), media_type=kind,
                    headers={"Cache-Control": "public, max-age=86400", "X-Content-Type-Options": "nosniff"})


def install(app: FastAPI, public: bool) -> None:
    """Serve the pages on ``app`` (made with ``docs_url``, ``redoc_url`` and ``openapi_url`` None)."""
    router = APIRouter(dependencies=[] if public else [Depends(admin_key)], include_in_schema=False)

    @router.get(OPENAPI_PATH)
    async def schema() -> JSONResponse:
        return JSONResponse(app.openapi())

    @router.get(DOCS_PATH)
    async def swagger(request: Request) -> Response:
        return swagger_page(app, request, OPENAPI_PATH, ASSETS_PATH)

    @router.get(REDOC_PATH)
    async def redoc(request: Request) -> Response:
        return redoc_page(app, request, OPENAPI_PATH, ASSETS_PATH)

    @router.get(ASSETS_PATH + "/{name}")
    async def assets(name: str) -> Response:
        return asset(name)

    @router.get(DOCS_PATH + "/{rest:path}")
    @router.get(REDOC_PATH + "/{rest:path}")
    async def elsewhere(rest: str) -> Response:
        """Any other address under the pages: 404, after the key check like the rest."""
        raise NotFound("there is no documentation page at this address; see /docs or /redoc")

    app.include_router(router)


@functools.cache
def _asset(name: str) -> bytes:
    return (ASSETS / name).read_bytes()
