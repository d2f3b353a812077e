"""The API's documentation pages for a signed-in admin: ``/ui/api-docs`` (Swagger UI),
``/ui/api-docs/redoc`` and the schema they read, behind the UI session (any role: they only read).

``/docs`` takes an admin key in the Authorization header, which a browser does not send; here the
session cookie (its path is /ui) does the same. The pages and their assets are app/api/docs.py's.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from app.api import docs
from app.ui.web import UiRoute, signed_in

router = APIRouter(route_class=UiRoute)
BASE = "/ui/api-docs"
SCHEMA, ASSETS = f"{BASE}/openapi.json", f"{BASE}/assets"


@router.get("/api-docs")
async def swagger(request: Request) -> Response:
    await signed_in(request)
    return docs.swagger_page(request.app, request, SCHEMA, ASSETS)


@router.get("/api-docs/redoc")
async def redoc(request: Request) -> Response:
    await signed_in(request)
    return docs.redoc_page(request.app, request, SCHEMA, ASSETS)


@router.get("/api-docs/openapi.json")
async def schema(request: Request) -> Response:
    await signed_in(request)
    return JSONResponse(request.app.openapi(), headers={"Cache-Control": "no-store"})


@router.get("/api-docs/assets/{name}")
async def asset(request: Request, name: str) -> Response:
    await signed_in(request)
    return docs.asset(name)
