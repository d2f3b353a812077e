"""The admin web UI at /ui: one router for app/main.py to include.

Every asset ships in this package (templates/, static/): the UI works offline, with no CDN and
no build step.
"""

from __future__ import annotations

import re

from fastapi import APIRouter, Request, Response
from fastapi.responses import FileResponse

from app.ui import (
    activity_pages,
    api,
    audit_pages,
    auth,
    docs_pages,
    models_pages,
    organizations_pages,
    projects_pages,
    services_pages,
    usage_pages,
)
from app.ui.web import HERE, UiRoute, admin_if_any, render

STATIC = HERE / "static"
_ASSET = re.compile(r"^[a-z0-9-]+\.(css|js|svg)$")
_TYPES = {"css": "text/css; charset=utf-8", "js": "text/javascript; charset=utf-8", "svg": "image/svg+xml"}

pages = APIRouter(route_class=UiRoute)


@pages.get("/static/{name}")
async def static(name: str) -> Response:
    """A file of static/ (names are checked: nothing outside that folder is served)."""
    path = STATIC / name
    if not _ASSET.match(name) or not path.is_file():
        return Response("not found", status_code=404, media_type="text/plain")
    kind = name.rsplit(".", 1)[1]
    return FileResponse(path, media_type=_TYPES[kind],
                        headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"})


@pages.get("/{rest:path}")
async def not_found(request: Request, rest: str) -> Response:
    return render(request, "error.html", await admin_if_any(request), status=404, title="Not found",
                  text="There is no page at this address. Start again from the services page.",
                  request_id=request.scope.get("state", {}).get("request_id"))


router = APIRouter(prefix="/ui", route_class=UiRoute)
router.add_api_route("", auth.home, methods=["GET"], include_in_schema=False)
router.add_api_route("/", auth.home, methods=["GET"], include_in_schema=False)
for part in (auth, services_pages, models_pages, projects_pages, organizations_pages, usage_pages, activity_pages,
             audit_pages, api, docs_pages):
    router.include_router(part.router, include_in_schema=False)
router.include_router(pages, include_in_schema=False)  # last: its catch-all answers what no page does
