"""Arbiter's exception tree, and the one JSON error shape of SPEC §1.

    ArbiterError                      -> {"error": msg, "detail": {"error_type", "message"}}
    ├── InvalidRequest (400)          invalid_request_error
    │   ├── ValidationFailed (400)    detail is a list of {loc, msg, type}
    │   └── RequestTimeout (408)      the request did not arrive whole in time (the server answers it)
    ├── AuthenticationFailed (401)    authentication_error, WWW-Authenticate: Bearer
    ├── PermissionDenied (403)        permission_error
    ├── NotFound (404)                not_found_error
    ├── Conflict (409)                conflict_error
    ├── Unsupported (405)             unsupported_error (a decision nobody here can answer)
    ├── MethodNotAllowed (405)        method_not_allowed, with Allow
    ├── TooLarge (413)                request_too_large
    │   └── HeadersTooLarge (431)     request_too_large (the header section; the server answers it)
    ├── UnsupportedEncoding (415)     unsupported_error, with Accept-Encoding
    ├── RateLimited (429)             rate_limit_error, with Retry-After
    ├── UpstreamAuthFailed (500)      upstream_auth_error
    └── BackendFailed (502/503/504)   backend_error

Lower-level errors are translated at the boundary and re-raised ``from exc``.
"""

from __future__ import annotations

from typing import Any

import orjson


class ArbiterError(Exception):
    status = 500
    error_type = "internal_error"
    backend_seconds = 0.0  # of the request's time, spent waiting on backends before this failure
    served_by: tuple[str, str, str] | None = None  # the replica tried last, for metrics (Replica.tried_at)

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = dict(headers or {})

    def detail(self) -> Any:
        return {"error_type": self.error_type, "message": self.message}

    def body(self) -> bytes:
        return orjson.dumps({"error": self.message, "detail": self.detail()})


class InvalidRequest(ArbiterError):
    status = 400
    error_type = "invalid_request_error"


class ValidationFailed(InvalidRequest):
    """A body that is not JSON or breaks the field rules: ``detail`` is a list."""

    def __init__(self, problems: list[dict[str, Any]]) -> None:
        first = problems[0]
        where = ".".join(str(part) for part in first["loc"][1:])
        super().__init__(f"{where}: {first['msg']}" if where else first["msg"])
        self.problems = problems

    def detail(self) -> Any:
        return self.problems


class RequestTimeout(InvalidRequest):
    status = 408


class AuthenticationFailed(ArbiterError):
    status = 401
    error_type = "authentication_error"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"WWW-Authenticate": "Bearer"})


class PermissionDenied(ArbiterError):
    status = 403
    error_type = "permission_error"


class NotFound(ArbiterError):
    status = 404
    error_type = "not_found_error"


class Unsupported(ArbiterError):
    status = 405
    error_type = "unsupported_error"


class MethodNotAllowed(ArbiterError):
    status = 405
    error_type = "method_not_allowed"


class Conflict(ArbiterError):
    status = 409
    error_type = "conflict_error"


class TooLarge(ArbiterError):
    status = 413
    error_type = "request_too_large"


class HeadersTooLarge(TooLarge):
    status = 431


class UnsupportedEncoding(ArbiterError):
    status = 415
    error_type = "unsupported_error"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"Accept-Encoding": "gzip, zstd, identity"})


class RateLimited(ArbiterError):
    status = 429
    error_type = "rate_limit_error"


class UpstreamAuthFailed(ArbiterError):
    status = 500
    error_type = "upstream_auth_error"


class BackendFailed(ArbiterError):
    error_type = "backend_error"

    def __init__(self, status: int, message: str, *, retry_after: int | None = None) -> None:
        headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
        super().__init__(message, headers=headers)
        self.status = status


def problem(loc: tuple[Any, ...] | list[Any], msg: str, type_: str) -> dict[str, Any]:
    """One entry of a validation error's ``detail`` list."""
    return {"loc": ["body", *loc], "msg": msg, "type": type_}
