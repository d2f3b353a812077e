"""Small pure-ASGI pieces: sending a response, reading the headers a route needs."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from app.errors import ArbiterError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def header_map(scope: Scope, wanted: frozenset[bytes]) -> dict[str, str]:
    """The request headers named in ``wanted`` (lower-case bytes), as str."""
    found: dict[str, str] = {}
    for name, value in scope["headers"]:
        if name in wanted:
            found[name.decode("latin-1")] = value.decode("latin-1")
    return found


async def send_bytes(send: Send, status: int, body: bytes, content_type: str,
                     headers: dict[str, str] | None = None, *, close: bool = False) -> None:
    raw = [(b"content-type", content_type.encode("latin-1")),
           (b"content-length", str(len(body)).encode())]
    if headers:
        raw.extend((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items())
    if close:
        raw.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def send_error(send: Send, error: ArbiterError, *, close: bool = False) -> None:
    await send_bytes(send, error.status, error.body(), "application/json", error.headers, close=close)
