"""Small pure-ASGI pieces: sending a response, reading the headers a route needs."""

from __future__ import annotations

import asyncio
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


async def unless_client_leaves(receive: Receive, send: Send, serve: Callable[[Send], Awaitable[None]]) -> bool:
    """Run ``serve(send)`` until it is done or the client hangs up, whichever comes first. True when
    the client hung up: ``serve`` was then cancelled, and its ``finally`` blocks have run.

    For a route that has read its whole body and then waits on something slow (a backend, a
    stream): uvicorn's ``send`` silently drops what a gone client would have got, so the route
    would go on to the end, holding what it holds. ``receive`` says ``http.disconnect`` when the
    client leaves, and also once the answer is complete: that one is not a hang-up."""
    answered = False

    async def sending(message: Message) -> None:
        nonlocal answered
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            answered = True
        await send(message)

    work = asyncio.ensure_future(serve(sending))
    watch = asyncio.ensure_future(_disconnect(receive))
    try:
        await asyncio.wait((work, watch), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this request is cancelled itself (the server stops): so is its work
        work.cancel()
        raise
    finally:
        watch.cancel()
    left = not work.done() and not answered
    if left:
        work.cancel()
    await asyncio.wait((work,))
    if not work.cancelled():
        work.result()  # what the work raised, if anything
    return left


async def _disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
