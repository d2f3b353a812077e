"""Admin routes for usage: per day and per model, for a project or the whole gateway."""

from __future__ import annotations

import datetime as dt
from typing import Any

from fastapi import APIRouter

from app.api.deps import AdminDep, AdminRoute, ComponentsDep
from app.telemetry import usage
from app.tenancy import service as tenancy

router = APIRouter(prefix="/admin", route_class=AdminRoute)


@router.get("/usage")
async def gateway_usage(_actor: AdminDep, c: ComponentsDep, since: dt.date | None = None,
                        until: dt.date | None = None) -> dict[str, Any]:
    """Every project's usage, per day and per model (and per project)."""
    return {"data": await c.in_session(lambda s: usage.summary(s, since=since, until=until))}


@router.get("/projects/{name}/usage")
async def project_usage(name: str, _actor: AdminDep, c: ComponentsDep, since: dt.date | None = None,
                        until: dt.date | None = None) -> dict[str, Any]:
    def work(s: Any) -> list[dict[str, Any]]:
        tenancy.get_project(s, name)  # 404 for an unknown project
        return usage.summary(s, project=name, since=since, until=until)
    return {"data": await c.in_session(work)}


@router.get("/usage/recent")
async def recent_requests(_actor: AdminDep, c: ComponentsDep, project: str | None = None,
                          limit: int = 50) -> dict[str, Any]:
    limit = max(1, min(limit, 1000))
    return {"data": await c.in_session(lambda s: usage.recent(s, project=project, limit=limit))}
