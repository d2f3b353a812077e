"""Fault injection for the emulators' work endpoints (decisions, chat, embeddings).

A `Faults` object is shared between the test thread and the server thread; the
test flips knobs at run time and the next request sees them. `respond()` wraps
an endpoint: it applies the knobs, and otherwise returns the real answer.

Order, when several knobs are set: latency, hang, drop_connection, status,
non_json, huge_body_bytes, then the real answer, sent normally, cut short
(reset_mid_body) or one byte at a time (trickle_delay). A streamed real answer
(NDJSON, SSE) is written by its handler, which applies those last two itself
(see `streaming.stream_events`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, fields
from typing import Any

from aiohttp import web

NON_JSON_BODY = b"<html>oops</html>"
DEFAULT_FAULT_BODY = b'{"error":"injected fault"}'
DEFAULT_FAULT_CONTENT_TYPE = "application/json; charset=utf-8"
_HUGE_CHUNK = 64 * 1024


@dataclass
class Faults:
    """Knobs mutable from any thread; `reset()` clears them all."""

    latency: float = 0.0  # seconds to sleep before doing anything else
    status: int | None = None  # answer with this status, `body` and `content_type`
    body: bytes = DEFAULT_FAULT_BODY
    content_type: str = DEFAULT_FAULT_CONTENT_TYPE
    headers: dict[str, str] = field(default_factory=dict)  # extra headers for `status`
    drop_connection: bool = False  # close the socket without answering
    non_json: bool = False  # 200 text/html that is not JSON
    hang: bool = False  # accept and never answer
    reset_mid_body: bool = False  # headers and part of the body, then abort
    huge_body_bytes: int = 0  # 200 with a JSON-looking body of this many bytes
    trickle_delay: float = 0.0  # the real answer one byte at a time, this far apart
    applied: int = 0  # how many requests went through respond() (for tests)

    def reset(self) -> None:
        for f in fields(self):
            if f.name == "applied":
                continue
            default = f.default_factory() if callable(f.default_factory) else f.default
            setattr(self, f.name, default)

    @property
    def active(self) -> bool:
        return bool(
            self.latency > 0
            or self.status is not None
            or self.drop_connection
            or self.non_json
            or self.hang
            or self.reset_mid_body
            or self.huge_body_bytes > 0
            or self.trickle_delay > 0
        )


# `real` returns either a `web.Response` (sent by `respond`) or a `web.StreamResponse`
# it has already prepared and written (streams: passed through as is).
Handler = Callable[[], Awaitable[web.StreamResponse]]


async def respond(request: web.Request, faults: Faults, real: Handler) -> web.StreamResponse:
    """Answer `request` with `real()` unless a fault knob says otherwise."""
    faults.applied += 1
    if faults.latency > 0:
        await asyncio.sleep(faults.latency)
    if faults.hang:
        await _forever()
    if faults.drop_connection:
        _close(request, abort=False)
        await _forever()  # cancelled when the connection is lost
    if faults.status is not None:
        headers = {"Content-Type": faults.content_type, **faults.headers}
        return web.Response(status=faults.status, body=faults.body, headers=headers)
    if faults.non_json:
        return web.Response(
            status=200, body=NON_JSON_BODY, headers={"Content-Type": "text/html; charset=utf-8"}
        )
    if faults.huge_body_bytes > 0:
        return await _huge(request, faults.huge_body_bytes)
    response = await real()
    if not isinstance(response, web.Response):
        return response  # already streamed by the handler
    if faults.reset_mid_body:
        return await _reset_mid_body(request, response)
    if faults.trickle_delay > 0:
        return await _trickle(request, response, faults.trickle_delay)
    return response


async def _forever() -> None:
    await asyncio.Event().wait()


def _close(request: web.Request, *, abort: bool) -> None:
    transport = request.transport
    if transport is None:
        return
    if abort:
        transport.abort()
    else:
        transport.close()


def _body_of(response: web.Response) -> bytes:
    body = response.body
    if isinstance(body, bytes | bytearray):
        return bytes(body)
    if response.text is not None:
        return response.text.encode(response.charset or "utf-8")
    return b""


def _stream_like(response: web.Response, length: int) -> web.StreamResponse:
    stream = web.StreamResponse(status=response.status, reason=response.reason)
    for key, value in response.headers.items():
        if key.lower() not in ("content-length", "transfer-encoding"):
            stream.headers[key] = value
    stream.content_length = length
    return stream


async def _reset_mid_body(request: web.Request, response: web.Response) -> web.StreamResponse:
    body = _body_of(response)
    stream = _stream_like(response, len(body))
    await stream.prepare(request)
    await stream.write(body[: max(1, len(body) // 2)])
    await asyncio.sleep(0.02)  # let the partial body reach the client first
    _close(request, abort=True)
    await _forever()
    return stream  # pragma: no cover - unreachable


async def _trickle(
    request: web.Request, response: web.Response, delay: float
) -> web.StreamResponse:
    body = _body_of(response)
    stream = _stream_like(response, len(body))
    await stream.prepare(request)
    for i in range(len(body)):
        await stream.write(body[i : i + 1])
        if i + 1 < len(body):
            await asyncio.sleep(delay)
    await stream.write_eof()
    return stream


def huge_body(size: int) -> tuple[bytes, bytes, int]:
    """Head, tail and padding length of a JSON object that is exactly `size` bytes."""
    head, tail = b'{"answers":{},"padding":"', b'"}'
    pad = size - len(head) - len(tail)
    if pad < 0:
        return (b"{" + b" " * max(0, size - 2) + b"}")[:size], b"", 0
    return head, tail, pad


async def _huge(request: web.Request, size: int) -> web.StreamResponse:
    stream = web.StreamResponse(status=200)
    stream.headers["Content-Type"] = "application/json; charset=utf-8"
    stream.content_length = size
    await stream.prepare(request)
    head, tail, pad = huge_body(size)
    await stream.write(head)
    chunk = b"x" * _HUGE_CHUNK
    while pad > 0:
        n = min(pad, _HUGE_CHUNK)
        await stream.write(chunk[:n])
        pad -= n
    if tail:
        await stream.write(tail)
    await stream.write_eof()
    return stream


def faulty_route(state_key: Any, work: Any) -> Any:
    """A handler calling ``work(request, state)`` through the state's fault knobs."""

    async def handler(request: web.Request) -> web.StreamResponse:
        state = request.app[state_key]
        return await respond(request, state.faults, lambda: work(request, state))

    return handler
