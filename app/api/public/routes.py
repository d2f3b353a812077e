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


NOT_READY = ("the database is behind the code's migrations, or unavailable and nothing was loaded from it "
             "since this process started")
DATABASE_CHECK_TIMEOUT = 2.0  # seconds; inside a probe's usual 3 s (a database that does not answer at all)


@router.get("/readyz", **answer(Ready, also={503: (NotReady, NOT_READY)}))
async def readyz(components: ComponentsDep) -> JSONResponse:
    """Ready while decisions can be served. The database away is reported, not failed on, once this
    process has loaded its state from it: cached keys and the models keep serving (every replica
    shares the one database, so failing readiness would take all of them out at once)."""
    try:
        database, reason = await asyncio.wait_for(asyncio.to_thread(components.database.state),
                                                  DATABASE_CHECK_TIMEOUT)
    except TimeoutError:
        database, reason = "unreachable", "the database is unavailable (no answer in time)"
    if database == "behind" or (reason is not None and not components.loaded):
        return JSONResponse({"status": "not ready", "reason": reason}, status_code=503)
    if not components.loaded:  # the database is back; the start-up's next try is moments away
        return JSONResponse({"status": "not ready", "reason": "starting: loading from the database"},
                            status_code=503)
    answer: dict[str, Any] = {"status": "ready"}
    if reason is not None:
        answer.update(status="degraded", database="unreachable", reason=reason)
    if components.redis is not None:
        # Reported, not failed on: every replica shares the one Redis, so failing readiness would
        # take all of them out at once, unlimited projects included.
        limiter = components.limiter
        up = await limiter.ping()
        answer["redis"] = "ok" if up else "unreachable"
        answer["rate_limits"], answer["replicas"] = limiter.mode, limiter.replicas()
        if not up:
            answer["degraded"] = "rate-limited requests are " + {
                "local_share": f"counted by each replica against 1/{limiter.replicas()} of each limit",
                "open": "let through (ARBITER_RATE_LIMIT_FALLBACK=open)",
            }.get(limiter.mode, "refused with 503 (ARBITER_RATE_LIMIT_FALLBACK=closed)")
    return JSONResponse(answer)
