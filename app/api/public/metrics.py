"""GET /metrics: Prometheus, behind its own bearer token (ARBITER_METRICS_TOKEN), or an admin
key when no token is set; with ARBITER_METRICS_PORT it is served on that port instead."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import APIRouter, Header
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app.api.deps import ComponentsDep
from app.errors import AuthenticationFailed, NotFound
from app.tenancy.keys import bearer_token

router = APIRouter()


@router.get("/metrics", include_in_schema=False)
async def metrics(c: ComponentsDep, authorization: Annotated[str | None, Header()] = None) -> Response:
    settings = c.settings
    if settings.metrics_port is not None:
        raise NotFound(f"metrics are served on port {settings.metrics_port}")
    if settings.metrics_token is not None:
        token = bearer_token(authorization) or ""
        if not hmac.compare_digest(token.encode(), settings.metrics_token.get_secret_value().encode()):
            raise AuthenticationFailed("/metrics needs the metrics token (ARBITER_METRICS_TOKEN) as a bearer")
    else:
        await c.keys.authenticate(authorization, "admin")
    c.observer.drain()  # the requests answered so far, all of them (their bookkeeping can lag a little)
    return Response(generate_latest(c.metrics.registry), media_type=CONTENT_TYPE_LATEST)
