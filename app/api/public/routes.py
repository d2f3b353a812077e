"""Public routes served by FastAPI: /v1/models, /v1/usage, /healthz, /readyz (and the documented
shape of /v1/systemone, whose POST is taken by the lean route before FastAPI sees it)."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from app.api.deps import ComponentsDep, ProjectDep
from app.api.documented import answer
from app.api.public.answers import Alive, ModelListing, NotReady, ProjectUsage, Ready
from app.errors import InvalidRequest
from app.services import model_list
from app.telemetry import usage

router = APIRouter()
USAGE_PAGE = 1000  # rows of /v1/usage a page unless asked otherwise


@router.get("/v1/models", **answer(ModelListing))
async def list_models(principal: ProjectDep, components: ComponentsDep) -> dict[str, Any]:
    """The models and aliases this key's project may use, in OpenAI's and TypeSafe's shapes."""
    return model_list.listing(components.registry, principal)


@router.get("/v1/usage", **answer(ProjectUsage))
async def project_usage(principal: ProjectDep, components: ComponentsDep, since: dt.date | None = None,
                        until: dt.date | None = None,
                        days: Annotated[int | None, Query(ge=1, le=3660)] = None,
                        limit: Annotated[int, Query(ge=1, le=10_000)] = USAGE_PAGE,
                        cursor: str | None = None) -> dict[str, Any]:
    """The key's own project's usage per day and model: the admin API's query (GET
    /admin/projects/{name}/usage), for the project only. ``days``: the last N UTC days, today
    included, instead of ``since``. ``limit`` rows a page; ``next`` is the ``cursor`` of the next.
    Read on the report pool, at most ARBITER_USAGE_READS_PER_MINUTE a minute per key."""
    if days is not None:
        if since is not None:
            raise InvalidRequest("give either days or since, not both")
        since = dt.datetime.now(dt.UTC).date() - dt.timedelta(days=days - 1)
    name = principal.project_name or ""
    after = usage.after_cursor(cursor) if cursor else None
    rows = await components.in_report(
        lambda s: usage.summary(s, project=name, since=since, until=until, limit=limit + 1, after=after),
        who=principal.key_id, what=f"{since or 'the first day'} to {until or 'today'}")
    more = len(rows) > limit
    rows = rows[:limit]
    return {"project": name, "since": since.isoformat() if since else None,
            "until": until.isoformat() if until else None, "data": rows,
            "next": usage.cursor(rows[-1]) if more else None}


@router.get("/healthz", **answer(Alive))
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


NOT_READY = "the database is unavailable or behind the code's migrations"


@router.get("/readyz", **answer(Ready, also={503: (NotReady, NOT_READY)}))
async def readyz(components: ComponentsDep) -> JSONResponse:
    reason = await asyncio.to_thread(components.database.unready_reason)
    if reason is not None:
        return JSONResponse({"status": "not ready", "reason": reason}, status_code=503)
    answer: dict[str, Any] = {"status": "ready"}
    if components.redis is not None:
        # Reported, not failed on: every replica shares the one Redis, so failing readiness would
        # take all of them out at once, unlimited projects included.
        up = await components.limiter.ping()
        answer["redis"] = "ok" if up else "unreachable"
        if not up:
            answer["degraded"] = ("rate-limited requests are " + (
                "let through (ARBITER_RATE_LIMIT_FAIL_OPEN=true)" if components.settings.rate_limit_fail_open
                else "refused with 503 (fail closed)"))
    return JSONResponse(answer)
