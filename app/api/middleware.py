"""Pure ASGI middleware. The stack is assembled in ``build_stack``, so its order is visible."""

from __future__ import annotations

import functools
import os
import random
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from app.api.asgi import ASGIApp, Message, Receive, Scope, Send, send_error
from app.errors import BackendFailed, InvalidRequest
from app.request_ids import CallerRequestId
from app.telemetry import logs
from app.telemetry.metrics import Metrics
from app.telemetry.tracing import Tracing

_SAFE_ID = re.compile(rb"^[A-Za-z0-9._:-]{1,64}$")
# Routes disagreed on which of several Authorization headers counts (the lean routes took the last,
# FastAPI's the first): a proxy that adds one in front of the caller's would pick the key. Refused
# on every route, before any key is looked up, with the connection closed (the body is not read).
DUPLICATE_AUTHORIZATION = InvalidRequest("more than one Authorization header; send exactly one")


class RequestMiddleware:
    """Per HTTP request: an id (the caller's X-Request-Id when it is sane, carrying Arbiter's own
    for the audit log on the routes that may audit: app/request_ids.py), echoed on the answer;
    requests in flight; requests by route and status once answered; the access line of every
    request no route wrote one for (a decision's and a chat's are their records', written by the
    observer: a lean route that made one marks the scope's state ``recorded``). One layer with one wrapper
    of ``send``, and the labelled metric children looked up once, not per request (the hot path
    pays for every layer). Routes are templates (or the lean routes' paths), never raw paths,
    so the label set stays small: the full template a route is served at, from ``templates``
    (by the id of the route object the framework puts in the scope, whose own ``path`` lacks
    the prefixes of the routers that include it), else that route's ``path``."""

    def __init__(self, app: ASGIApp, metrics: Metrics, lean_paths: frozenset[str],
                 templates: Mapping[int, str], traced: bool = False) -> None:
        self.app = app
        self.metrics = metrics
        self.traced = traced  # the access lines carry the server span's ids (it is current in here)
        self.lean_paths = lean_paths
        self.templates = templates
        # Requests in flight per route: plain counts, read by the gauge when /metrics is scraped
        # (a Gauge's inc and dec take a lock each).
        self._in_flight = dict.fromkeys((*lean_paths, "api"), 0)
        for path in self._in_flight:
            metrics.in_flight.labels(path).set_function(functools.partial(self._in_flight.__getitem__, path))
        self._counters: dict[tuple[str, str, int], Any] = {}
        # Request ids need to be unique and unguessable from each other, not secret. os.urandom
        # releases the GIL for its system call, which lets a background thread (the usage
        # writer) in and can hold a request up for a whole switch interval (5 ms): this
        # generator, seeded from the system's, makes them without a system call.
        self._ids = random.Random(os.urandom(32))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        request_id = None
        authorizations = 0
        for name, value in scope["headers"]:  # the one pass over the headers: the id, and a check
            if name == b"authorization":
                authorizations += 1
            elif name == b"x-request-id" and request_id is None and _SAFE_ID.match(value):
                request_id = value.decode()
        path = scope["path"]
        lean = path if path in self.lean_paths else None
        if request_id is None:
            request_id = f"{self._ids.getrandbits(128):032x}"
        elif lean is None:  # a route that may audit: Arbiter's own id rides along (the lean ones never do)
            request_id = CallerRequestId(request_id, f"{self._ids.getrandbits(128):032x}")
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        logs.request_id.set(request_id)  # for the log lines of this request; no reset: its task ends with it
        header = (b"x-request-id", request_id.encode())
        gauge = lean or "api"
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), header]
            await send(message)

        self._in_flight[gauge] += 1
        try:
            if authorizations > 1:
                await send_error(send_with_id, DUPLICATE_AUTHORIZATION, close=True)
                return
            await self.app(scope, receive, send_with_id)
        finally:
            self._in_flight[gauge] -= 1
            route = lean or self._template(scope.get("route"))
            key = (route, scope["method"], status)
            counter = self._counters.get(key)
            if counter is None:
                counter = self.metrics.requests.labels(route, scope["method"], str(status))
                if len(self._counters) < 10_000:  # methods are the caller's: keep the cache bounded
                    self._counters[key] = counter
            counter.inc()
            if lean is None or "recorded" not in state:
                client = scope.get("client")  # the proxy's client, once ProxyHeadersMiddleware trusted it
                logs.log_http(request_id, scope["method"], path, route, status, time.perf_counter() - started,
                              client[0] if client else None, logs.current_trace_ids() if self.traced else None)

    def _template(self, route: Any) -> str:
        return self.templates.get(id(route)) or getattr(route, "path", None) or "unmatched"


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


def build_stack(app: ASGIApp, metrics: Metrics, lean_paths: frozenset[str], templates: Mapping[int, str],
                tracing: Tracing, max_concurrency: int = 0) -> ASGIApp:
    """Outermost first: the server span (when tracing is on), request id and metrics, the cap."""
    if max_concurrency > 0:
        app = ConcurrencyCap(app, max_concurrency, lean_paths, metrics.shed.inc)
    stack: ASGIApp = RequestMiddleware(app, metrics, lean_paths, templates, traced=tracing.on)
    if tracing.on:
        from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware

        stack = OpenTelemetryMiddleware(stack, tracer_provider=tracing.provider, exclude_spans=["receive", "send"],
                                        excluded_urls="healthz,readyz,metrics")
    return stack
