"""Errors of ``POST /v1/decisions`` in the OpenAI shape, which is what its clients parse:

    {"error": {"message": "...", "type": "...", "param": "..." | null, "code": "..." | null}}

``type`` is Arbiter's ``error_type`` (the names OpenAI uses where there is one:
``invalid_request_error``, ``authentication_error``, ``permission_error``, ``not_found_error``,
``rate_limit_error``; Arbiter's own otherwise). A backend's error keeps its status and its
message, put into this shape.
"""

from __future__ import annotations

from typing import Any

import orjson

from app.errors import ArbiterError, RateLimited, ValidationFailed

_BACKEND_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                  404: "not_found_error", 413: "request_too_large", 422: "invalid_request_error",
                  429: "rate_limit_error"}
_MESSAGE_MAX = 2000


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type_, "param": param, "code": code}})


def from_arbiter(error: ArbiterError) -> bytes:
    """Arbiter's own error, in the OpenAI shape."""
    param = getattr(error, "param", None)
    code = getattr(error, "code", None)
    if isinstance(error, ValidationFailed) and code is None:
        code = str(error.problems[0].get("type") or "") or None
    elif isinstance(error, RateLimited):
        code = "rate_limit_exceeded"
    return error_body(error.message, error.error_type, param, code)


def from_backend(status: int, content_type: str | None, body: bytes) -> bytes:
    """A backend's error answer (any status but 200), in the OpenAI shape with its own message."""
    message, param, code = _read(body)
    type_ = _BACKEND_TYPES.get(status) or ("invalid_request_error" if status < 500 else "backend_error")
    return error_body(message or f"the backend answered HTTP {status} without a message", type_, param, code)


def _read(body: bytes) -> tuple[str, str | None, str | None]:
    """The message, param and code of a backend's error body, whichever shape it has."""
    try:
        data: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        return _clip(body.decode("utf-8", "replace").strip()), None, None
    param = code = None
    message: Any = None
    if isinstance(data, dict):
        inner = data.get("error")
        if isinstance(inner, dict):  # OpenAI's and vLLM's shape
            message = inner.get("message")
            param = inner.get("param") if isinstance(inner.get("param"), str) else None
            code = inner.get("code") if isinstance(inner.get("code"), str) else None
        elif isinstance(inner, str):  # Ollama's
            message = inner
        elif "detail" in data:  # FastAPI's
            message = data["detail"]
        elif "message" in data:
            message = data["message"]
    if message is None:
        message = data
    if not isinstance(message, str):
        message = orjson.dumps(message).decode()
    return _clip(message), param, code


def _clip(text: str) -> str:
    return text if len(text) <= _MESSAGE_MAX else text[:_MESSAGE_MAX] + "..."
