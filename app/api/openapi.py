"""The OpenAPI document (``/openapi.json`` and the pages that read it, app/api/docs.py): FastAPI's
own, then made to say what the server really does, in one place, so routes added later are
covered without a line of their own.

FastAPI infers the document from the routes, and three things escape it here:

- **Who may call.** Keys are read by Arbiter's dependencies (app/api/deps.py) and by the lean
  routes (app/api/public/intake.py), not by FastAPI's security classes, so it declares no
  scheme. Here the document gets the schemes (``projectKey``, ``adminKey``, ``meshCredential``)
  and each operation its requirement, from its route: an ``AdminRoute``, or a dependency on an
  admin key, takes ``adminKey``; a dependency on a project key ``projectKey``; the lean routes
  say so themselves (lean_openapi.py). Swagger UI then has its Authorize button.
- **No 422.** FastAPI declares 422 for every route with parameters; the server answers 400
  (app/api/errors.py). Here 422 goes, and what every route of a kind can answer is declared,
  with the ``Error`` body: 400 everywhere (a bad body or parameter; more than one
  ``Authorization`` header, refused on every route), 401 and 503 (the key cannot be checked
  while the database is away) wherever a key is taken, 403 where some role is refused the
  route's permission, 404 where the path names an object, 429 on the admin routes while failed
  keys are throttled. A route names only its own refusals (a 409: app/api/documented.py).
- **What is not per operation.** A wrong method (405 with ``Allow``) and what the HTTP server
  answers before any route is known (408, 431, 503 at ``ARBITER_MAX_CONNECTIONS``) are said once,
  in the document's description.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute, iter_route_contexts
from pydantic.json_schema import models_json_schema
from starlette.routing import BaseRoute

from app.api.deps import AdminRoute, admin_actor, admin_principal, project_principal
from app.api.documented import Error
from app.api.throttle import GUARDED
from app.settings import Settings
from app.tenancy import roles

PROJECT_KEY, ADMIN_KEY, MESH_CREDENTIAL = "projectKey", "adminKey", "meshCredential"
SCHEMES = {
    PROJECT_KEY: {"type": "http", "scheme": "bearer", "bearerFormat": "arb_proj_...",
                  "description": "A project key: the model routes, /v1/models and /v1/usage "
                                 "(POST /admin/projects/{name}/keys, or arbiter project create-key)."},
    ADMIN_KEY: {"type": "http", "scheme": "bearer", "bearerFormat": "arb_admin_...",
                "description": "An admin key of a role (owner, operator, viewer, project-admin): the /admin "
                               "routes, and these pages. A project key never opens them."},
    MESH_CREDENTIAL: {"type": "apiKey", "in": "header", "name": "Authorization",
                      "description": "Mesh peers only: `ArbiterMesh ...`, signed per request with "
                                     "ARBITER_MESH_KEY (docs/mesh.md). Tenants send a project key."},
}
_CREDENTIAL_OF = {admin_actor: ADMIN_KEY, admin_principal: ADMIN_KEY, project_principal: PROJECT_KEY}
_ERROR = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
_RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before trying again", "schema": {"type": "integer"}}}
_BAD_REQUEST = {"description": "a body or a parameter that breaks the rules (detail lists every problem); "
                               "more than one Authorization header", "content": _ERROR}
_UNAUTHENTICATED = {"description": "no key, or an unknown, revoked, expired or tampered one, or a key of the "
                                   "other kind", "content": _ERROR,
                    "headers": {"WWW-Authenticate": {"description": "Bearer", "schema": {"type": "string"}}}}
_REFUSED = {"description": "the key's role may not do this (the refusal is audited)", "content": _ERROR}
_NOT_FOUND = {"description": "what the path names does not exist", "content": _ERROR}
_THROTTLED = {"description": "too many failed admin keys from this address (ARBITER_AUTH_FAILURE_LIMIT)",
              "content": _ERROR, "headers": _RETRY_AFTER}
_UNAVAILABLE = {"description": "the database is unavailable: the key cannot be checked, or the change made",
                "content": _ERROR, "headers": _RETRY_AFTER}
DESCRIPTION = """

Send a key as `Authorization: Bearer <key>`: a project key on the model routes, `/v1/models`
and `/v1/usage`, an admin key on `/admin/...` (Swagger UI's Authorize takes either). Arbiter's
errors are `{"error": "<sentence>", "detail": {"error_type", "message"}}` (for a bad body or
parameter, `detail` lists every problem; on `/v1/decisions`, OpenAI's shape); a backend's own
error comes back as it came. There is no 422: validation is 400. Not repeated per operation: a
wrong method is 405 with `Allow`; before any route is known the server may answer 400 (a
request it cannot parse), 408 (the request did not arrive in time), 431 (the header section is
over 64 KiB) or 503 (at ARBITER_MAX_CONNECTIONS, `Retry-After: 1`)."""


def install(app: FastAPI, settings: Settings) -> None:
    """``app.openapi()`` returns the honest document (FastAPI's, rebuilt when its routes change)."""
    generate = app.openapi
    made: list[dict[str, Any]] = []
    throttled = settings.auth_failure_limit > 0

    def openapi() -> dict[str, Any]:
        document = generate()
        if not made or made[0] is not document:
            made[:] = [honest(document, app.routes, throttled=throttled)]
        return document

    app.openapi = openapi  # type: ignore[method-assign]


def honest(document: dict[str, Any], routes: Sequence[BaseRoute], *, throttled: bool) -> dict[str, Any]:
    """``document`` (FastAPI's, changed in place) with the schemes, each operation's security
    requirement and the responses the server really gives, 422 gone."""
    document["info"]["description"] = document["info"].get("description", "") + DESCRIPTION
    components = document.setdefault("components", {})
    components["securitySchemes"] = {name: dict(scheme) for name, scheme in SCHEMES.items()}
    schemas = components.setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):  # only ever referenced by 422s
        schemas.pop(name, None)
    _, error_schemas = models_json_schema([(Error, "serialization")], ref_template="#/components/schemas/{model}")
    for name, schema in error_schemas.get("$defs", {}).items():
        schemas.setdefault(name, schema)
    for route, dependant, path, method in _operations(routes):
        operation = document["paths"][path][method]
        credential = _credential(route, dependant)
        if credential is not None and "security" not in operation:  # a lean route says its own
            operation["security"] = [{credential: []}]
        operation["responses"].pop("422", None)
        for status, response in _declared(route, path, operation, throttled).items():
            operation["responses"].setdefault(status, response)
        operation["responses"] = dict(sorted(operation["responses"].items()))
    return document


def _operations(routes: Sequence[BaseRoute]) -> Iterator[tuple[APIRoute, Dependant, str, str]]:
    """(route as declared, its dependant as served, its path as in the document, method) of
    every operation the document holds."""
    for context in iter_route_contexts(routes):
        route = context.original_route
        if isinstance(route, APIRoute) and context.include_in_schema:
            for method in sorted(context.methods or ()):
                yield route, context.dependant, str(context.path_format), method.lower()


def _credential(route: APIRoute, dependant: Dependant) -> str | None:
    """The scheme of the key a route takes: ``adminKey`` for an AdminRoute (it checks the key
    itself, before its dependencies), else whatever its dependencies read."""
    if isinstance(route, AdminRoute):
        return ADMIN_KEY
    return next((_CREDENTIAL_OF[d.call] for d in _dependencies(dependant) if d.call in _CREDENTIAL_OF), None)


def _dependencies(dependant: Dependant) -> Iterator[Dependant]:
    for sub in dependant.dependencies:
        yield sub
        yield from _dependencies(sub)


def _declared(route: APIRoute, path: str, operation: dict[str, Any], throttled: bool) -> dict[str, Any]:
    """The errors every route of this one's kind can answer."""
    declared: dict[str, Any] = {"400": _BAD_REQUEST}
    if "security" in operation:
        declared |= {"401": _UNAUTHENTICATED, "503": _UNAVAILABLE}
    if isinstance(route, AdminRoute) and roles.refusable(route.permission.need):
        declared["403"] = _REFUSED
    if any(p.get("in") == "path" for p in operation.get("parameters", ())):
        declared["404"] = _NOT_FOUND
    if throttled and path.startswith(GUARDED) and "security" in operation:
        declared["429"] = _THROTTLED
    return declared
