"""Map every error to SPEC §1's shape, FastAPI's own 404/405/422 included."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from sqlalchemy.exc import DataError, IntegrityError, SQLAlchemyError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from app.errors import (
    ArbiterError,
    BackendFailed,
    Conflict,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    ValidationFailed,
)

log = logging.getLogger("arbiter.api")
_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def error_response(error: ArbiterError) -> Response:
    return Response(error.body(), status_code=error.status, media_type="application/json",
                    headers=error.headers)


def install(app: FastAPI) -> None:
    @app.exception_handler(ArbiterError)
    async def arbiter_error(_request: Request, exc: ArbiterError) -> Response:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, exc: RequestValidationError) -> Response:
        problems = [
            {"loc": list(e.get("loc", ())), "msg": e.get("msg", "invalid"), "type": e.get("type", "value_error")}
            for e in exc.errors()
        ] or [{"loc": ["body"], "msg": "invalid request", "type": "value_error"}]
        for p in problems:
            if p["type"] == "json_invalid":  # FastAPI's loc is ("body", <offset>): not a field
                p["loc"], p["msg"] = ["body"], "the body is not valid JSON"
        return error_response(ValidationFailed(problems))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404:
            return error_response(NotFound(f"no route {request.method} {request.url.path}"))
        if exc.status_code == 405:
            allow = _allowed_methods(request) or (exc.headers or {}).get("Allow", "")
            error = MethodNotAllowed(f"{request.method} is not allowed on {request.url.path}; use {allow}")
            error.headers["Allow"] = allow
            return error_response(error)
        other = ArbiterError(str(exc.detail))
        other.status = exc.status_code
        return error_response(other)

    @app.exception_handler(SQLAlchemyError)
    async def database_error(_request: Request, exc: SQLAlchemyError) -> Response:
        if isinstance(exc, IntegrityError):  # lost a race on a unique name
            return error_response(Conflict("that name is taken; it was created by another request just now"))
        if isinstance(exc, DataError):  # a value the database cannot store (a NUL character, say)
            return error_response(InvalidRequest("a value in the request cannot be stored "
                                                 "(control characters such as NUL are not allowed)"))
        log.error("database error: %s", type(exc).__name__)
        return error_response(BackendFailed(503, "the database is unavailable; try again shortly",
                                            retry_after=5))

    @app.exception_handler(Exception)
    async def unexpected(_request: Request, exc: Exception) -> Response:
        log.exception("unexpected error", exc_info=exc)
        return error_response(ArbiterError("internal error; the request id is in X-Request-Id"))


def _allowed_methods(request: Request) -> str:
    """Every method that some route takes on this path (Starlette's 405 names the first route's only)."""
    routes = request.app.router.routes
    return ", ".join(m for m in _METHODS
                     if any(r.matches({**request.scope, "method": m})[0] is Match.FULL for r in routes))
