"""``create_app(settings)``: one fresh application, no module-level state.

The outer ASGI app sends ``POST /v1/systemone``, ``/v1/decisions`` and the chat paths to the
lean routes and everything else to FastAPI; the middleware stack wraps both.
"""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, cast

from fastapi import FastAPI
from fastapi.routing import iter_route_contexts
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from app.api import docs as api_docs
from app.api import errors
from app.api import mesh as mesh_routes
from app.api import openapi as api_openapi
from app.api.admin import aliases as admin_aliases
from app.api.admin import mesh as admin_mesh
from app.api.admin import models as admin_models
from app.api.admin import services as admin_services
from app.api.admin import tenancy as admin_tenancy
from app.api.admin import usage as admin_usage
from app.api.asgi import ASGIApp, Receive, Scope, Send
from app.api.middleware import build_stack
from app.api.public import lean_openapi
from app.api.public import metrics as public_metrics
from app.api.public import routes as public_routes
from app.api.public.chat import PATHS as CHAT_PATHS
from app.api.public.chat import ChatRoute
from app.api.public.openai_decisions import OPENAI_DECISIONS_PATH, OpenAIDecisionsRoute
from app.api.public.systemone import DECISION_PATH, SystemOneRoute
from app.api.throttle import FailedKeyThrottle
from app.components import Components
from app.decisions.budget import DecodeBudget
from app.decisions.offloop import OffLoop
from app.decisions.openai_api.forward import OpenAIDecisionForwarder
from app.settings import Settings
from app.ui import routes as ui_routes


class Arbiter:
    """The ASGI application. ``components`` and ``fastapi`` are there for tests and tools."""

    def __init__(self, settings: Settings, tracer_provider: Any = None) -> None:
        self.settings = settings
        self.components = Components(settings, tracer_provider)
        self.fastapi = _build_fastapi(self.components)
        # X-Forwarded-Proto/-For from a trusted proxy (uvicorn's rule: ARBITER_FORWARDED_ALLOW_IPS),
        # for the routes that read them (the UI's Secure cookie, the mesh peer's address). The lean
        # routes never do: they skip this layer.
        # Inside it, failed admin keys are throttled per client address (app/api/throttle.py).
        c = self.components
        self._framework = cast(ASGIApp, ProxyHeadersMiddleware(
            cast(Any, FailedKeyThrottle(cast(ASGIApp, self.fastapi), c.throttle)),
            trusted_hosts=settings.forwarded_allow_ips))
        off_loop = OffLoop()  # one pool of body decoders for both decision routes
        budget = DecodeBudget(settings.decode_budget_bytes)  # and one budget for what bodies grow to
        self.decisions = SystemOneRoute(c.keys, c.forwarder, c.touches, c.observer, c.tracing, settings,
                                        c.mesh.auth, off_loop, budget)
        self.chat = ChatRoute(c.keys, c.chat, c.touches, c.observer, settings, c.mesh.auth, budget, off_loop)
        # The same registry, replica router (in-flight counts, back-off), limiter and tracing.
        openai = OpenAIDecisionForwarder(c.registry, c.router, settings, c.tracing, c.limiter, salts=c.salts)
        self.openai_decisions = OpenAIDecisionsRoute(c.keys, openai, c.touches, c.observer, c.tracing, settings,
                                                     c.mesh.auth, off_loop, budget)
        self.route_templates = RouteTemplates(self.fastapi)
        self._observer = c.observer
        self._stack: ASGIApp = build_stack(self._route, c.metrics,
                                           frozenset({DECISION_PATH, OPENAI_DECISIONS_PATH, *CHAT_PATHS}),
                                           self.route_templates, c.tracing, settings.max_concurrency)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._observer.soon()  # the last requests' bookkeeping, once this one first waits (observer.py)
        await self._stack(scope, receive, send)

    async def _route(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == OPENAI_DECISIONS_PATH:
            await self.openai_decisions(scope, receive, send)  # every method: its 405 is OpenAI-shaped
            return
        if scope["type"] == "http" and scope["method"] == "POST":
            if scope["path"] == DECISION_PATH:
                await self.decisions(scope, receive, send)
                return
            if scope["path"] in CHAT_PATHS:
                await self.chat(scope, receive, send)
                return
        await self._framework(scope, receive, send)


YOUNG_GC_THRESHOLD = 10_000


def _build_fastapi(components: Components) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await components.start()
        # Everything built so far lives as long as the process: move it out of the
        # collector's sight, so full collections under load scan only request garbage
        # (measured: 55-70 ms pauses at concurrency 32 without this).
        gc.collect()
        gc.freeze()
        # At the default threshold (700) the objects of requests in flight alone trip a young
        # collection every few dozen requests at concurrency 64, and it frees nothing (they are
        # alive; their garbage goes by reference counting): measured 1.2 ms each, ~22 µs per
        # decision. With 10,000 there were none in 10,000 requests; cycles are still collected.
        gc.set_threshold(YOUNG_GC_THRESHOLD, *gc.get_threshold()[1:])
        try:
            yield
        finally:
            await components.stop()

    # No redirect_slashes: a 307 for `POST /v1/systemone/` makes clients drop the body or the
    # Authorization header; a path with a trailing slash is an unknown route (404) like any other.
    # The UI needs none either: its catch-all page answers /ui/... paths first.
    # The documentation pages are app/api/docs.py's: their assets served here, behind an admin key.
    app = FastAPI(title="Arbiter", version="0.1.0", lifespan=lifespan, redirect_slashes=False,
                  description="A multi-tenant gateway for decision models.",
                  docs_url=None, redoc_url=None, openapi_url=None)
    app.state.components = components
    errors.install(app)
    api_docs.install(app, components.settings.public_api_docs)
    api_openapi.install(app, components.settings)  # security schemes, 400 never 422, the real statuses
    app.include_router(public_routes.router)
    app.include_router(public_metrics.router)
    app.include_router(admin_tenancy.router)
    app.include_router(admin_services.router)
    app.include_router(admin_models.router)
    app.include_router(admin_aliases.router)
    app.include_router(admin_usage.router)
    app.include_router(ui_routes.router)  # the admin web UI at /ui
    app.include_router(admin_mesh.router)
    app.include_router(mesh_routes.router)

    # POST on these paths is taken by the lean routes before FastAPI; declared here so that
    # other methods get FastAPI's 405 with Allow, and the routes appear in the OpenAPI schema
    # (documented only: lean_openapi.py; FastAPI never reads their bodies nor checks their answers).
    app.add_api_route(DECISION_PATH, _served_by_lean_route, methods=["POST"], summary="System One decisions",
                      **lean_openapi.systemone())
    app.add_api_route(OPENAI_DECISIONS_PATH, _served_by_lean_route, methods=["POST"],
                      summary="The OpenAI Decisions API, on every decision model", **lean_openapi.openai_decisions())
    for path in CHAT_PATHS:
        app.add_api_route(path, _served_by_lean_route, methods=["POST"],
                          summary="Chat, forwarded to a model with the completion capability",
                          **lean_openapi.chat(path))

    return app


def _route_templates(app: FastAPI) -> dict[int, str]:
    """The full template each route is served at (``/ui/sign-in``), by the id of its route object.

    FastAPI (since 0.137) puts a route in ``scope["route"]`` as it was declared: a route of a router
    included in another (the UI's pages in ``/ui``) has a ``path`` without the outer prefix. Each
    router here is included once, so a route object names one template (one included twice would
    be counted under one of its places)."""
    return {id(context.original_route): context.path for context in iter_route_contexts(app.routes)
            if context.path is not None}


class RouteTemplates(Mapping[int, str]):
    """``_route_templates(app)``, made when first read. Making them builds every route's context
    in FastAPI (its dependants and validators): half a second of CPU, which an app that is only
    asked the lean routes never needs, and which FastAPI otherwise does per router on the first
    request to it. A test suite that starts gateways by the hundred saves minutes. ``arbiter
    serve`` makes them before it serves (app/server.py): the first admin request pays nothing,
    and what they hold is made before the lifespan's ``gc.freeze``."""

    def __init__(self, app: FastAPI) -> None:
        self._app = app
        self._templates: dict[int, str] | None = None

    def resolve(self) -> dict[int, str]:
        if self._templates is None:
            self._templates = _route_templates(self._app)
        return self._templates

    def __getitem__(self, key: int) -> str:
        return self.resolve()[key]

    def __iter__(self) -> Iterator[int]:
        return iter(self.resolve())

    def __len__(self) -> int:
        return len(self.resolve())


async def _served_by_lean_route() -> None:  # pragma: no cover - POST never reaches FastAPI
    """Served by a lean ASGI route in front of FastAPI."""


def create_app(settings: Settings | None = None, *, tracer_provider: Any = None) -> Arbiter:
    """A fresh app. ``tracer_provider`` overrides the one OTEL_* would configure (tests)."""
    return Arbiter(settings or Settings(), tracer_provider)
