"""Request recording and small HTTP helpers shared by the emulators."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

# Emulators accept big bodies so that they, not aiohttp, decide what is too large.
CLIENT_MAX_SIZE = 256 * 1024 * 1024

_MISSING = object()


@dataclass
class RecordedRequest:
    """One request as the emulator received it."""

    method: str
    path: str
    headers: dict[str, str]
    json: Any  # parsed JSON body, or None when the body is empty or not JSON
    body: bytes = b""  # the raw body bytes, exactly as received
    query: dict[str, str] = field(default_factory=dict)

    def header(self, name: str, default: str | None = None) -> str | None:
        """Case-insensitive header lookup."""
        lowered = name.lower()
        for key, value in self.headers.items():
            if key.lower() == lowered:
                return value
        return default


def parse_json(body: bytes) -> Any:
    """The parsed JSON of `body`, or `_MISSING` when it is empty or not JSON."""
    if not body:
        return _MISSING
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return _MISSING


def is_missing(value: Any) -> bool:
    return value is _MISSING


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# The log keeps the newest requests only, so a long benchmark or soak run does not
# grow the emulator without bound (tests look at the last few).
MAX_RECORDED = 1000


def recording_middleware(requests: list[RecordedRequest]) -> Any:
    """A middleware that appends every request (before any check) to `requests`,
    keeping the newest MAX_RECORDED."""

    @web.middleware
    async def record(request: web.Request, handler: Handler) -> web.StreamResponse:
        body = await request.read() if request.can_read_body else b""
        parsed = parse_json(body)
        requests.append(
            RecordedRequest(
                method=request.method,
                path=request.path,
                headers={k: v for k, v in request.headers.items()},
                json=None if parsed is _MISSING else parsed,
                body=body,
                query={k: v for k, v in request.query.items()},
            )
        )
        if len(requests) > MAX_RECORDED:
            del requests[: len(requests) - MAX_RECORDED]
        return await handler(request)

    return record


def json_response(
    payload: Any, status: int = 200, content_type: str = "application/json; charset=utf-8"
) -> web.Response:
    return web.Response(
        status=status, body=orjson.dumps(payload), headers={"Content-Type": content_type}
    )


def bearer_token(request: web.Request) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (scheme case-insensitive)."""
    value = request.headers.get("Authorization")
    if not value:
        return None
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip()


def version_tuple(version: str) -> tuple[tuple[int, ...], bool]:
    """Numeric parts of a version and whether it is a release (no pre-release suffix).

    "0.35.0" -> ((0, 35, 0), True); "0.35.0-rc1" -> ((0, 35, 0), False);
    "v0.6.5" -> ((0, 6, 5), True). Unreadable parts count as 0.
    """
    text = version.strip().lstrip("vV")
    core, sep, _pre = text.partition("-")
    core = core.partition("+")[0]
    parts: list[int] = []
    for piece in core.split("."):
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        parts.append(int(digits) if digits else 0)
    while len(parts) < 3:
        parts.append(0)
    return tuple(parts), not sep


def version_at_least(version: str, minimum: str) -> bool:
    """Numeric comparison; a pre-release of `minimum` counts as older."""
    have, have_release = version_tuple(version)
    need, _ = version_tuple(minimum)
    if have != need:
        return have > need
    return have_release
