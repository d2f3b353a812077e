"""Admin routes for usage: per day and per model, for a project or the whole gateway. A
project-admin sees its own projects' usage only."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from app.api.admin.answers import RecentRequests, UsageSummary
from app.api.deps import AdminPrincipalDep, AdminRoute, ComponentsDep, needs, refuse_unless
from app.api.documented import answer
from app.telemetry import usage
from app.tenancy import roles
from app.tenancy import service as tenancy
from app.tenancy.roles import Need

router = APIRouter(prefix="/admin", route_class=AdminRoute)
PAGE = 1000  # summary rows a page, unless asked otherwise (a 90-day answer of every project can be MBs)
Limit = Annotated[int, Query(ge=1, le=10_000, description="rows a page (the answer's next gives the page after)")]


@router.get("/usage", dependencies=[needs(Need.SCOPED_READ)], **answer(UsageSummary))
async def gateway_usage(who: AdminPrincipalDep, c: ComponentsDep, since: dt.date | None = None,
                        until: dt.date | None = None, limit: Limit = PAGE, cursor: str | None = None) -> dict[str, Any]:
    """Every project's usage (a project-admin's projects'), per day and per model (and per project),
    ``limit`` rows a page: ``next`` is the ``cursor`` of the page after, null on the last."""
    visible = roles.visible_projects(who)
    after = usage.after_cursor(cursor) if cursor else None
    rows = await c.in_report(lambda s: usage.summary(s, since=since, until=until, projects=visible, limit=limit + 1,
                                                     after=after), who=who.key_id, what=_what(since, until, None))
    return paged(rows, limit)


@router.get("/projects/{name}/usage", dependencies=[needs(Need.PROJECT_READ, "name")], **answer(UsageSummary))
async def project_usage(name: str, who: AdminPrincipalDep, c: ComponentsDep, since: dt.date | None = None,
                        until: dt.date | None = None, limit: Limit = PAGE, cursor: str | None = None) -> dict[str, Any]:
    after = usage.after_cursor(cursor) if cursor else None

    def work(s: Any) -> list[dict[str, Any]]:
        tenancy.get_project(s, name)  # 404 for an unknown project
        return usage.summary(s, project=name, since=since, until=until, limit=limit + 1, after=after)
    return paged(await c.in_report(work, who=who.key_id, what=_what(since, until, name)), limit)


def paged(rows: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    """A page of ``usage.summary`` rows read with ``limit + 1``: the extra one says there is more."""
    more = len(rows) > limit
    rows = rows[:limit]
    return {"data": rows, "next": usage.cursor(rows[-1]) if more else None}


def _what(since: dt.date | None, until: dt.date | None, project: str | None) -> str:
    span = f"{since or 'the first day'} to {until or 'today'}"
    return f"{span} of {project!r}" if project else f"{span}, every project"


@router.get("/usage/recent", dependencies=[needs(Need.SCOPED_READ)], **answer(RecentRequests, errors={
    403: "a project-admin named a project it does not manage (audited)"}))
async def recent_requests(request: Request, who: AdminPrincipalDep, c: ComponentsDep, project: str | None = None,
                          limit: int = 50) -> dict[str, Any]:
    """The latest requests (a project-admin's projects'; naming another project is refused)."""
    if project is not None:
        await refuse_unless(request, who, Need.PROJECT_READ, project)
    limit = max(1, min(limit, 1000))
    visible = roles.visible_projects(who)
    return {"data": await c.in_report(lambda s: usage.recent(s, project=project, limit=limit, projects=visible),
                                      who=who.key_id, what="the latest requests")}
