"""The API's documentation pages: Swagger UI at ``/docs``, ReDoc at ``/redoc`` and the schema at
``/openapi.json``.

FastAPI's own pages load their scripts from a CDN without integrity checks: whoever serves that
file runs code in an admin's browser on this origin. Here the scripts come from the
``fastapi-offline`` package (Swagger UI and ReDoc, as released) and are served by Arbiter at
``/docs/assets/``. The schema lists every admin route, so the pages, the schema and the assets
(everything under ``/docs`` and ``/redoc``) take an admin key unless ``ARBITER_PUBLIC_API_DOCS``
opens them.
"""

from __future__ import annotations

import functools
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


async def admin_key(request: Request) -> None:
    """401 without an admin key (any role: the pages only read)."""
    await components(request).keys.authenticate(request.headers.get("authorization"), "admin")


def install(app: FastAPI, public: bool) -> None:
    """Serve the pages on ``app`` (made with ``docs_url``, ``redoc_url`` and ``openapi_url`` None)."""
    router = APIRouter(dependencies=[] if public else [Depends(admin_key)], include_in_schema=False)

    @router.get(OPENAPI_PATH)
    async def schema() -> JSONResponse:
        return JSONResponse(app.openapi())

    @router.get(DOCS_PATH)
    async def swagger(request: Request) -> Response:
        root = request.scope.get("root_path", "")
        page = get_swagger_ui_html(openapi_url=root + OPENAPI_PATH, title=f"{app.title} - Swagger UI",
                                   swagger_js_url=f"{root}{ASSETS_PATH}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{root}{ASSETS_PATH}/swagger-ui.css",
                                   swagger_favicon_url=f"{root}{ASSETS_PATH}/favicon.png",
                                   swagger_ui_parameters=SWAGGER_PARAMETERS)
        page.headers.update(PAGE_HEADERS)
        return page

    @router.get(REDOC_PATH)
    async def redoc(request: Request) -> Response:
        root = request.scope.get("root_path", "")
        page = get_redoc_html(openapi_url=root + OPENAPI_PATH, title=f"{app.title} - ReDoc",
                              redoc_js_url=f"{root}{ASSETS_PATH}/redoc.standalone.js",
                              redoc_favicon_url=f"{root}{ASSETS_PATH}/favicon.png", with_google_fonts=False)
        page.headers.update(PAGE_HEADERS)
        return page

    @router.get(ASSETS_PATH + "/{name}")
    async def asset(name: str) -> Response:
        kind = ASSET_TYPES.get(name)
        if kind is None:  # only the files named above: nothing else of the package is served
            raise NotFound(f"no documentation asset '{name}'")
        return Response(_asset(name), media_type=kind,
                        headers={"Cache-Control": "public, max-age=86400", "X-Content-Type-Options": "nosniff"})

    @router.get(DOCS_PATH + "/{rest:path}")
    @router.get(REDOC_PATH + "/{rest:path}")
    async def elsewhere(rest: str) -> Response:
        """Any other address under the pages: 404, after the key check like the rest."""
        raise NotFound("there is no documentation page at this address; see /docs or /redoc")

    app.include_router(router)


@functools.cache
def _asset(name: str) -> bytes:
    return (ASSETS / name).read_bytes()
