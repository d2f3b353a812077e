"""Streamed answers (NDJSON and Server-Sent Events) paced in time, fault-aware.

`stream_events()` prepares a chunked response and writes one event at a time,
`delay` seconds apart, so a client sees them arrive one by one. Of the fault
knobs that act on the real answer, `reset_mid_body` aborts the connection after
about half of the events and `trickle_delay` writes each event a byte at a time.
A client that goes away ends the stream quietly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import orjson
from aiohttp import web

from .faults import Faults

NDJSON = "application/x-ndjson"
SSE_DONE = b"data: [DONE]\n\n"


def ndjson_line(payload: Any) -> bytes:
    return orjson.dumps(payload) + b"\n"


def sse_event(payload: Any) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


async def stream_events(
    request: web.Request,
    events: Sequence[bytes],
    *,
    content_type: str,
    delay: float = 0.0,
    faults: Faults | None = None,
    headers: dict[str, str] | None = None,
) -> web.StreamResponse:
    """Send `events` as one chunked 200 response, `delay` seconds apart."""
    response = web.StreamResponse(status=200)
    response.headers["Content-Type"] = content_type
    response.headers["Cache-Control"] = "no-cache"
    for key, value in (headers or {}).items():
        response.headers[key] = value
    await response.prepare(request)
    cut = max(1, len(events) // 2) if faults is not None and faults.reset_mid_body else None
    trickle = faults.trickle_delay if faults is not None else 0.0
    try:
        for index, event in enumerate(events):
            if cut is not None and index == cut:
                await asyncio.sleep(0.02)  # let the partial stream reach the client first
                transport = request.transport
                if transport is not None:
                    transport.abort()
                return response
            if index and delay > 0:
                await asyncio.sleep(delay)
            await write_event(response, event, trickle)
        await response.write_eof()
    except ConnectionError:
        pass  # the client went away; nothing more to send
    return response


async def write_event(response: web.StreamResponse, event: bytes, trickle: float = 0.0) -> None:
    if trickle <= 0:
        await response.write(event)
        return
    for i in range(len(event)):
        await response.write(event[i : i + 1])
        await asyncio.sleep(trickle)
