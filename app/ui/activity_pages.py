"""What happened: the mesh (the audit log: audit_pages.py; usage: usage_pages.py)."""

from __future__ import annotations

import inspect
import logging
from typing import Any

from fastapi import APIRouter, Request, Response

from app.tenancy.roles import Need
from app.ui.roles import permitted
from app.ui.web import UiRoute, components, render

router = APIRouter(route_class=UiRoute)
log = logging.getLogger("arbiter.ui")


@router.get("/mesh")
async def mesh_page(request: Request) -> Response:
    admin = await permitted(request, Need.READ)
    status, error = await mesh_status(components(request))
    return render(request, "mesh.html", admin, mesh=status, error=error)


async def mesh_status(c: Any) -> tuple[dict[str, Any] | None, str | None]:
    """The mesh's status as ``GET /admin/mesh`` gives it; None when this node is standalone."""
    mesh = getattr(c, "mesh", None)
    status_of = getattr(mesh, "status", None)
    if status_of is None:
        return None, None
    try:
        status = status_of()
        if inspect.isawaitable(status):
            status = await status
    except Exception:
        log.exception("reading the mesh status failed")
        return None, "The mesh status could not be read; the server's log says why."
    if not isinstance(status, dict) or not status.get("enabled"):
        return None, None
    return status, None
