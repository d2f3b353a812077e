"""Pure ASGI middleware. The stack is assembled in ``build_stack``, so its order is visible."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable

from app.api.asgi import ASGIApp, Message, Receive, Scope, Send, send_error
from app.errors import BackendFailed
from app.telemetry.metrics import Metrics
from app.telemetry.tracing import Tracing

_SAFE_ID = re.compile(rb"^[A-Za-z0-9._:-]{1,64}$")


class RequestIdMiddleware:
    """Gives every request an id (the caller's X-Request-Id when it is sane) and echoes it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = None
        for name, value in scope["headers"]:
            if name == b"x-request-id" and _SAFE_ID.match(value):
                request_id = value.decode()
                break
        if request_id is None:
            request_id = uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        header = (b"x-request-id", request_id.encode())

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), header]
            await send(message)

        await self.app(scope, receive, send_with_id)


class MetricsMiddleware:
    """Requests by route and status, and requests in flight. Routes are templates (or the lean
    routes' paths), never raw paths, so the label set stays small."""

    def __init__(self, app: ASGIApp, metrics: Metrics, lean_paths: frozenset[str]) -> None:
        self.app = app
        self.metrics = metrics
        self.lean_paths = lean_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        lean = path if path in self.lean_paths else None
        gauge = self.metrics.in_flight.labels(lean or "api")
        status = [500]

        async def send_with_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        gauge.inc()
        try:
            await self.app(scope, receive, send_with_status)
        finally:
            gauge.dec()
            route = lean or getattr(scope.get("route"), "path", None) or "unmatched"
            self.metrics.requests.labels(route, scope["method"], str(status[0])).inc()


class ConcurrencyCap:
    """Sheds load past ``limit`` model requests in flight: 503 with Retry-After at once, before
    the body is read, so a flood is refused cheaply and the process keeps serving the rest."""

    def __init__(self, app: ASGIApp, limit: int, paths: frozenset[str], on_shed: Callable[[], None]) -> None:
        self.app = app
        self.limit = limit
        self.paths = paths
        self.on_shed = on_shed
        self.active = 0  # one event loop: a plain counter is safe

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in self.paths:
            await self.app(scope, receive, send)
            return
        if self.active >= self.limit:
            self.on_shed()
            error = BackendFailed(503, f"Arbiter is at its limit of {self.limit} requests in flight; "
                                       "try again shortly", retry_after=1)
            await send_error(send, error, close=True)
            return
        self.active += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.active -= 1


def build_stack(app: ASGIApp, metrics: Metrics, lean_paths: frozenset[str], tracing: Tracing,
                max_concurrency: int = 0) -> ASGIApp:
    """Outermost first: the server span (when tracing is on), request id, metrics, the cap."""
    if max_concurrency > 0:
        app = ConcurrencyCap(app, max_concurrency, lean_paths, metrics.shed.inc)
    stack: ASGIApp = RequestIdMiddleware(MetricsMiddleware(app, metrics, lean_paths))
    if tracing.on:
        from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware

        stack = OpenTelemetryMiddleware(stack, tracer_provider=tracing.provider, exclude_spans=["receive", "send"],
                                        excluded_urls="healthz,readyz,metrics")
    return stack
