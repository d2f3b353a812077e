"""What happened: usage (tokens per day, recent requests), the audit log, and the mesh."""

from __future__ import annotations

import datetime as dt
import inspect
import logging
from typing import Any

from fastapi import APIRouter, Request, Response
from sqlalchemy.orm import Session

from app import audit
from app.telemetry import usage
from app.tenancy import roles
from app.tenancy import service as tenancy
from app.tenancy.roles import Need
from app.ui import charts
from app.ui.roles import permitted
from app.ui.web import UiRoute, components, render

router = APIRouter(route_class=UiRoute)
log = logging.getLogger("arbiter.ui")
PERIODS = (7, 14, 30, 90)
AUDIT_PAGE = 100


@router.get("/usage")
async def usage_page(request: Request, project: str = "", days: str = "14") -> Response:
    admin = await permitted(request, Need.SCOPED_READ)
    visible = roles.visible_projects(admin.principal) if admin.principal is not None else frozenset()
    period = int(days) if days.isdigit() and int(days) in PERIODS else 14  # anything else: the default
    last = dt.datetime.now(dt.UTC).date()
    first = last - dt.timedelta(days=period - 1)

    def work(s: Session) -> tuple[list[str], list[dict[str, Any]], list[dict[str, Any]]]:
        names = [p.name for p in tenancy.list_projects(s) if visible is None or p.name in visible]
        chosen = project if project in names else None  # a project-admin's own projects only
        return (names, usage.summary(s, project=chosen, since=first, until=last, projects=visible),
                usage.recent(s, project=chosen, limit=50, projects=visible))
    names, rows, recent = await components(request).in_session(work)
    chosen = project if project in names else ""
    return render(request, "usage.html", admin, projects=names, project=chosen, days=period, periods=PERIODS,
                  chart=charts.tokens_per_day(rows, first, last), totals=_totals(rows), recent=recent,
                  first=first, last=last, unknown_project=bool(project) and not chosen)


def _totals(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per project and model over the period."""
    totals: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        key = (row["project"] or "(deleted project)", row["model"])
        total = totals.setdefault(key, {"project": key[0], "model": key[1], "requests": 0, "input_tokens": 0,
                                        "output_tokens": 0, "errors": 0, "latency_sum": 0.0})
        for field in ("requests", "input_tokens", "output_tokens", "errors"):
            total[field] += row[field]
        total["latency_sum"] += row["mean_latency_ms"] * row["requests"]
    for total in totals.values():
        total["mean_latency_ms"] = round(total.pop("latency_sum") / max(1, total["requests"]), 1)
    return sorted(totals.values(), key=lambda t: (t["project"], t["model"]))


@router.get("/audit")
async def audit_page(request: Request, before_id: str = "") -> Response:
    admin = await permitted(request, Need.READ)
    before = int(before_id) if before_id.isdigit() and 1 <= int(before_id) <= 2**62 else None  # else page 1
    entries = await components(request).in_session(
        lambda s: audit.entries(s, limit=AUDIT_PAGE, before_id=before))
    older = entries[-1]["id"] if len(entries) == AUDIT_PAGE else None
    return render(request, "audit.html", admin, entries=entries, older=older, paged=before is not None)


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
