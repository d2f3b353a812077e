"""Admin routes for usage: per day and per model, for a project or the whole gateway. A
project-admin sees its own projects' usage only."""

from __future__ import annotations

import datetime as dt
from typing import Any

from fastapi import APIRouter, Request

from app.api.admin.answers import RecentRequests, UsageSummary
from app.api.deps import AdminPrincipalDep, AdminRoute, ComponentsDep, needs, refuse_unless
from app.api.documented import answer
from app.telemetry import usage
from app.tenancy import roles
from app.tenancy import service as tenancy
from app.tenancy.roles import Need

router = APIRouter(prefix="/admin", route_class=AdminRoute)


@router.get("/usage", dependencies=[needs(Need.SCOPED_READ)], **answer(UsageSummary))
async def gateway_usage(who: AdminPrincipalDep, c: ComponentsDep, since: dt.date | None = None,
                        until: dt.date | None = None) -> dict[str, Any]:
    """Every project's usage (a project-admin's projects'), per day and per model (and per project)."""
    visible = roles.visible_projects(who)
    return {"data": await c.in_session(lambda s: usage.summary(s, since=since, until=until, projects=visible))}


@router.get("/projects/{name}/usage", dependencies=[needs(Need.PROJECT_READ, "name")], **answer(UsageSummary))
async def project_usage(name: str, c: ComponentsDep, since: dt.date | None = None,
                        until: dt.date | None = None) -> dict[str, Any]:
    def work(s: Any) -> list[dict[str, Any]]:
        tenancy.get_project(s, name)  # 404 for an unknown project
        return usage.summary(s, project=name, since=since, until=until)
    return {"data": await c.in_session(work)}


@router.get("/usage/recent", dependencies=[needs(Need.SCOPED_READ)], **answer(RecentRequests, errors={
    403: "a project-admin named a project it does not manage (audited)"}))
async def recent_requests(request: Request, who: AdminPrincipalDep, c: ComponentsDep, project: str | None = None,
                          limit: int = 50) -> dict[str, Any]:
    """The latest requests (a project-admin's projects'; naming another project is refused)."""
    if project is not None:
        await refuse_unless(request, who, Need.PROJECT_READ, project)
    limit = max(1, min(limit, 1000))
    visible = roles.visible_projects(who)
    return {"data": await c.in_session(lambda s: usage.recent(s, project=project, limit=limit, projects=visible))}
