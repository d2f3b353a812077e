"""The usage pages: charts of tokens, requests by status and latency per day (per hour for the
last 24 hours) with totals per project and model; usage per key; the request drill-down and one
request's page; and their CSV downloads.

Every role reads usage (``Need.SCOPED_READ``); a project-admin sees its own projects' part only.
Naming a project, or a key, that it may not read is refused (403, audited) as the admin API's
``GET /admin/usage/recent?project=`` is; the charts page, as it always did, shows every visible
project instead of one it does not know."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Query, Request, Response
from sqlalchemy.orm import Session

from app.errors import InvalidRequest, NotFound
from app.telemetry import usage, usage_report, usage_requests
from app.telemetry.usage_report import Period
from app.telemetry.usage_requests import Filters
from app.tenancy import roles
from app.tenancy import service as tenancy
from app.tenancy.roles import Need
from app.text import ascii_digits
from app.ui import charts, usage_csv
from app.ui.roles import check, permitted
from app.ui.web import Admin, UiRoute, components, render

router = APIRouter(route_class=UiRoute)
log = logging.getLogger("arbiter.ui")
PERIODS = (1, 7, 14, 30, 90)  # days; 1 is the last 24 hours, by the hour
CSV_PAGE = 1000  # rows read per query while a CSV is sent
REQUEST_COLUMNS = ("time", "request_id", "project", "key_id", "key", "key_name", "operation", "model", "alias",
                   "backend", "status", "latency_ms", "input_tokens", "output_tokens")


def _days(value: str, default: int = 14) -> int:
    """A period from the address; anything but one of ``PERIODS`` is the default (never an error)."""
    return int(value) if ascii_digits(value) and int(value) in PERIODS else default


def _what(period: Period, project: str | None) -> str:
    """The report's range, for a 504's advice to narrow it."""
    span = "the last 24 hours" if period.hourly else f"{(period.end - period.start).days} days"
    return f"{span} of {project!r}" if project else f"{span} of every project"


def _visible(admin: Admin) -> frozenset[str] | None:
    return roles.visible_projects(admin.principal) if admin.principal is not None else frozenset()


def _names(s: Session, visible: frozenset[str] | None) -> dict[str, int]:
    """The projects the admin sees, name -> id."""
    return {p.name: p.id for p in tenancy.list_projects(s) if visible is None or p.name in visible}


@router.get("/usage")
async def usage_page(request: Request, project: str = "", days: str = "14") -> Response:
    admin = await permitted(request, Need.SCOPED_READ)
    visible = _visible(admin)
    period = Period.last(_days(days))

    def work(s: Session) -> dict[str, Any]:
        names = _names(s, visible)
        chosen = project if project in names else None  # a project-admin's own projects only
        return {"names": names, "chosen": chosen,
                "series": usage_report.series(s, period, project=chosen, projects=visible),
                "bins": usage_report.latency_bins(s, period, project=chosen, projects=visible),
                "totals": usage_report.totals(s, period, project=chosen, projects=visible),
                "recent": usage.recent(s, project=chosen, limit=50, projects=visible)}
    found = await components(request).in_report(work, who=admin.key_id, what=_what(period, project))
    buckets, hourly = period.buckets(), period.hourly
    return render(request, "usage.html", admin, projects=list(found["names"]),
                  project=found["chosen"] or "", days=_days(days), periods=PERIODS, period=period,
                  chart=charts.tokens(found["series"], buckets, hourly=hourly),
                  statuses=charts.statuses(found["series"], buckets, hourly=hourly),
                  latency=charts.latency(found["bins"], buckets, hourly=hourly),
                  totals=found["totals"], recent=found["recent"],
                  unknown_project=bool(project) and found["chosen"] is None)


@router.get("/usage/totals.csv")
async def totals_csv(request: Request, project: str = "", days: str = "14") -> Response:
    """The charts page's totals per bucket, project and model (one query: as many rows as buckets
    times projects times models, never one per request)."""
    admin = await permitted(request, Need.SCOPED_READ)
    visible = _visible(admin)
    period = Period.last(_days(days))

    def work(s: Session) -> list[dict[str, Any]]:
        if project and project not in _names(s, visible):
            raise NotFound(f"There is no project named {project[:200]!r} (among the projects you can see).")
        return usage_report.totals_per_bucket(s, period, project=project or None, projects=visible)
    rows = await components(request).in_report(work, who=admin.key_id, what=_what(period, project))
    columns = ("hour" if period.hourly else "day", "project", "model", "requests", "input_tokens",
               "output_tokens", *(f"status_{name}" for name in usage_report.STATUS_CLASSES), "mean_latency_ms")

    async def chunks() -> AsyncIterator[str]:
        yield usage_csv.lines([columns])
        for start in range(0, len(rows), CSV_PAGE):
            yield usage_csv.lines([[r["bucket"], r["project"], r["model"], r["requests"], r["input_tokens"],
                                    r["output_tokens"], *(r[name] for name in usage_report.STATUS_CLASSES),
                                    r["mean_latency_ms"]] for r in rows[start:start + CSV_PAGE]])
    name = usage_csv.filename("arbiter-usage", project or "all", period.first_day.isoformat(),
                              period.last_day.isoformat())
    return usage_csv.download(name, chunks())


@router.get("/usage/keys")
async def keys_page(request: Request, project: str = "", days: str = "14") -> Response:
    """Usage per key of one project: requests, tokens, errors, rate-limited requests, last use."""
    admin = await permitted(request, Need.SCOPED_READ)
    visible = _visible(admin)
    period = Period.last(_days(days))
    if project:
        await check(request, admin, Need.PROJECT_READ, project=project)

    def work(s: Session) -> tuple[dict[str, int], list[dict[str, Any]]]:
        names = _names(s, visible)
        if project and project not in names:
            raise NotFound(f"There is no project named {project[:200]!r}.")
        return names, usage_report.per_key(s, period, project) if project else []
    names, keys = await components(request).in_report(work, who=admin.key_id, what=_what(period, project))
    return render(request, "usage_keys.html", admin, projects=list(names), project=project,
                  project_id=names.get(project), days=_days(days), periods=PERIODS, period=period, keys=keys)


async def _filters(request: Request, admin: Admin, *, project: str, key: str, model: str,
                   status: str) -> Filters:
    """The drill-down's filters, checked: InvalidRequest (400) says what is wrong with one; a
    project (or a key's project) the admin may not read is refused (403, audited)."""
    filters = Filters(project=project or None, key_id=usage_requests.checked_key(key),
                      model=usage_requests.checked_model(model), status=usage_requests.checked_status(status))
    if filters.project is not None:
        await check(request, admin, Need.PROJECT_READ, project=filters.project)
    if filters.key_id is None:
        if filters.project is not None and filters.project not in await _all_names(request):
            raise InvalidRequest(f"There is no project named {filters.project[:200]!r}.")
        return filters
    key_id = filters.key_id
    owner = await components(request).in_session(lambda s: tenancy.project_of_key(s, key_id))
    await check(request, admin, Need.PROJECT_READ, project=owner)  # a project-admin: its projects' keys only
    if owner is None:
        raise InvalidRequest(f"There is no project key with id {key_id}.")
    if filters.project is not None and filters.project != owner:
        raise InvalidRequest(f"Key {key_id} is not a key of {filters.project!r}: it is one of {owner!r}.")
    return Filters(project=owner, key_id=key_id, model=filters.model, status=filters.status)


async def _all_names(request: Request) -> set[str]:
    return await components(request).in_session(lambda s: {p.name for p in tenancy.list_projects(s)})


@router.get("/usage/requests")
async def requests_page(request: Request, project: str = "", key: str = "", model: str = "", status: str = "",
                        days: str = "7", before_id: str = "") -> Response:
    """The latest requests that match the filters, newest first, ``usage_requests.PAGE`` a page."""
    admin = await permitted(request, Need.SCOPED_READ)
    visible = _visible(admin)
    period = Period.last(_days(days, 7))
    before = int(before_id) if ascii_digits(before_id) and 1 <= int(before_id) <= 2**62 else None  # else page 1
    asked = {"project": project, "key": key, "model": model, "status": status}
    filters: Filters | None = None
    error = ""
    try:
        filters = await _filters(request, admin, **asked)
    except InvalidRequest as exc:
        error = exc.message

    def work(s: Session) -> tuple[dict[str, int], list[dict[str, Any]], list[dict[str, Any]]]:
        names = _names(s, visible)
        chosen = filters.project if filters is not None else (project if project in names else None)
        keys = [tenancy.key_view(k) for k in tenancy.list_keys(s, project=chosen)] if chosen in names else []
        rows = usage_requests.page(s, filters, period, projects=visible, before_id=before,
                                   limit=usage_requests.PAGE + 1) if filters is not None else []
        return names, keys, rows
    names, keys, rows = await components(request).in_report(work, who=admin.key_id,
                                                            what=_what(period, filters.project if filters else ""))
    more = len(rows) > usage_requests.PAGE
    rows = rows[:usage_requests.PAGE]
    shown = asked if filters is None else {"project": filters.project or "", "key": str(filters.key_id or ""),
                                           "model": filters.model or "", "status": filters.status or ""}
    return render(request, "usage_requests.html", admin, status=200 if filters is not None else 400,
                  rows=rows, older=rows[-1]["id"] if more else None, paged=before is not None,
                  projects=list(names), keys=keys, values=shown, days=_days(days, 7), periods=PERIODS,
                  period=period, errors={"filters": error} if error else {},
                  query={k: v for k, v in {**shown, "days": str(_days(days, 7))}.items() if v})


@router.get("/usage/requests.csv")
async def requests_csv(request: Request, project: str = "", key: str = "", model: str = "", status: str = "",
                       days: str = "7") -> Response:
    """Every request of the period that matches the filters, newest first, read ``CSV_PAGE`` rows
    a query (each its own short transaction) while the download goes out: never all at once."""
    admin = await permitted(request, Need.SCOPED_READ)
    visible = _visible(admin)
    period = Period.last(_days(days, 7))
    filters = await _filters(request, admin, project=project, key=key, model=model, status=status)
    c = components(request)
    what = _what(period, filters.project or "")

    def rows_before(before: tuple[Any, int] | None) -> Any:
        return lambda s: usage_requests.export(s, filters, period, projects=visible, before=before, limit=CSV_PAGE)
    first = await c.in_report(rows_before(None), who=admin.key_id, what=what)  # a failure here is an error page

    async def chunks() -> AsyncIterator[str]:
        yield usage_csv.lines([REQUEST_COLUMNS])
        rows = first
        while rows:
            yield usage_csv.lines([[r["at"], r["request_id"], r["project"], r["key_id"], r["key"], r["key_name"],
                                    r["operation"], r["model"], r["alias"], r["provider"], r["status"],
                                    r["latency_ms"], r["input_tokens"], r["output_tokens"]] for r in rows])
            if len(rows) < CSV_PAGE:
                return
            try:  # the next page after the last row's (time, id): each page reads its own rows only
                rows = await c.in_report(rows_before(usage_requests.position(rows[-1])), what=what)
            except Exception:
                # The answer has started: its status cannot change. The download is cut short
                # (no final chunk), so the browser reports it failed rather than a partial file.
                log.exception("the requests CSV stopped after a failed read")
                raise
    name = usage_csv.filename("arbiter-requests", filters.project or "all", period.first_day.isoformat(),
                              period.last_day.isoformat())
    return usage_csv.download(name, chunks())


@router.get("/usage/request")
async def request_page(request: Request, request_id: str = Query("", alias="id")) -> Response:
    """One request by the id its caller got in ``X-Request-Id``: every record with that id (a
    caller may send the same id again) in the projects the admin sees."""
    admin = await permitted(request, Need.SCOPED_READ)
    visible = _visible(admin)
    try:
        wanted = usage_requests.checked_request_id(request_id)
    except InvalidRequest as exc:
        return render(request, "usage_request.html", admin, status=400, records=[], wanted=request_id.strip()[:70],
                      errors={"find": exc.message})
    if wanted is None:
        return render(request, "usage_request.html", admin, records=[], wanted="", errors={})

    def work(s: Session) -> tuple[list[dict[str, Any]], dict[str, int]]:
        return usage_requests.with_request_id(s, wanted, projects=visible), _names(s, visible)
    records, names = await components(request).in_report(work, who=admin.key_id, what="one request id")
    return render(request, "usage_request.html", admin, status=200 if records else 404, records=records,
                  wanted=wanted, project_ids=names, same_id=usage_requests.SAME_ID, errors={})
