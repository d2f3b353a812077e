"""Read a request body as a stream under a cap, decoding gzip or zstd with the same cap.

The cap applies to the decoded bytes; decoding stops at the cap, so a
decompression bomb is a 413, never an out-of-memory.
"""

from __future__ import annotations

import asyncio
import io
import zlib
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, cast

import zstandard

from app.decisions import zstdframes
from app.decisions.budget import FREE_BYTES, Reservation
from app.errors import InvalidRequest, TooLarge, UnsupportedEncoding

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
ENCODINGS = ("identity", "gzip", "zstd")


def content_encoding(header: str | None) -> str:
    """The one coding of a body ("identity", "gzip" or "zstd"), or UnsupportedEncoding (415)."""
    if not header:
        return "identity"
    codings = [c.strip().lower() for c in header.split(",") if c.strip()]
    codings = [c for c in codings if c != "identity"] or ["identity"]
    if len(codings) == 1 and codings[0] in ENCODINGS:
        return codings[0]
    if len(codings) == 1 and codings[0] == "x-gzip":
        return "gzip"
    raise UnsupportedEncoding(
        f"Content-Encoding {header!r} is not supported; send gzip, zstd or identity")


def check_length(header: str | None, cap: int) -> None:
    """Refuse a declared Content-Length over the cap before reading anything."""
    if header is None:
        return
    if not header.isascii() or not header.isdigit():
        raise InvalidRequest("Content-Length is not a number")
    if len(header) > 18:  # over an exabyte (and int() refuses over 4,300 digits)
        raise TooLarge(f"the body is over the {cap}-byte limit")
    length = int(header)
    if length > cap:
        raise TooLarge(f"the body is {length} bytes, over the {cap}-byte limit")


def _too_large(cap: int) -> TooLarge:
    return TooLarge(f"the body is over the {cap}-byte limit")


STEP = 1 << 20  # decoded at most this much at a time, then the event loop runs (~1 ms of zstd)
MAX_GZIP_MEMBERS = 1024  # a client gzips a body as one member; each more costs a decompressor
GZIP_SLICE = 1 << 16  # compressed bytes fed to zlib at a time


class _Decoded:
    """The decoded bytes of a body, grown a step at a time: each step reserves its bytes past the
    first MiB from the decode budget (budget.py) and lets the event loop run before the next."""

    def __init__(self, cap: int, grow: Reservation | None) -> None:
        self.cap = cap
        self.out = bytearray()
        self._grow = grow

    async def add(self, chunk: bytes) -> None:
        before = len(self.out)
        self.out += chunk
        if len(self.out) > self.cap:
            raise _too_large(self.cap)
        if len(self.out) > FREE_BYTES:  # a big body: the hot path's never gets here
            if self._grow is not None:
                self._grow.take(len(self.out) - max(before, FREE_BYTES))
            await asyncio.sleep(0)


class _Gzip:
    """Streaming gzip with a cap on the output; concatenated members included."""

    def __init__(self, decoded: _Decoded) -> None:
        self._decoded = decoded
        self._d = zlib.decompressobj(31)
        self._in_member = False  # the current member has had input
        self._members = 0  # members ended

    async def feed(self, data: bytes) -> None:
        # In slices: zlib copies what a member leaves unused (``unused_data``), so a slice bounds
        # each copy (whole, 32 MiB of tiny members would be copied once per member).
        view = memoryview(data)
        for start in range(0, len(view), GZIP_SLICE):
            await self._feed(view[start:start + GZIP_SLICE])

    async def _feed(self, data: bytes | memoryview) -> None:
        decoded = self._decoded
        while data:
            self._in_member = True
            room = min(decoded.cap - len(decoded.out) + 1, STEP)
            try:
                chunk = self._d.decompress(data, room)
            except zlib.error as exc:
                raise InvalidRequest(f"the gzip body is corrupt: {exc}") from exc
            await decoded.add(chunk)
            if self._d.eof:
                data = self._d.unused_data
                self._members += 1
                if self._members >= MAX_GZIP_MEMBERS and data:
                    raise InvalidRequest(f"the gzip body has more than {MAX_GZIP_MEMBERS} members; "
                                         "send one")
                self._d = zlib.decompressobj(31)
                self._in_member = False
            else:
                data = self._d.unconsumed_tail
                if not data and not chunk:
                    break

    async def finish(self) -> bytearray:
        if self._in_member and not self._d.eof:
            await self._decoded.add(self._d.flush())
            if not self._d.eof:
                raise InvalidRequest("the gzip body is truncated")
        return self._decoded.out


async def _zstd(compressed: bytes, decoded: _Decoded) -> bytearray:
    # Every frame whole first (zstdframes.py: headers only, nothing decoded): stream_reader returns
    # a prefix of a truncated frame without complaint. Then stream_reader().read(n), a step at a
    # time: a frame's declared size cannot be trusted.
    for verdict in zstdframes.walk(compressed, zstdframes.max_blocks(decoded.cap)):
        if verdict is None:
            await asyncio.sleep(0)  # a body of many blocks: let the loop run between steps
        elif not verdict:
            raise InvalidRequest(f"the zstd body is truncated, is not zstd, or has more than "
                                 f"{zstdframes.MAX_FRAMES} frames or a block for less than each KiB it "
                                 "may decode to; send one frame")
    reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(compressed), read_across_frames=True)
    try:
        while True:
            chunk = reader.read(min(STEP, decoded.cap - len(decoded.out) + 1))
            if not chunk:
                break
            await decoded.add(chunk)
    except zstandard.ZstdError as exc:
        raise InvalidRequest(f"the zstd body is corrupt: {exc}") from exc
    return decoded.out


async def read_body(receive: Receive, encoding: str, cap: int, grow: Reservation | None = None) -> bytes:
    """The decoded body, or TooLarge as soon as the cap is passed. A compressed body is decoded a
    step at a time, its growth reserved on ``grow`` (BackendFailed 503 when the budget is spent).
    A decoded body is a bytearray: copied into bytes, it would take twice its size for a moment."""
    gzip = _Gzip(_Decoded(cap, grow)) if encoding == "gzip" else None
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        data = message.get("body", b"")
        if data:
            if gzip is not None:
                await gzip.feed(data)
            else:
                size += len(data)
                if size > cap:
                    raise _too_large(cap)
                chunks.append(data)
        if not message.get("more_body", False):
            break
    if gzip is not None:
        return cast(bytes, await gzip.finish())  # read-only from here: a bytes-like, never copied
    raw = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    return cast(bytes, await _zstd(raw, _Decoded(cap, grow))) if encoding == "zstd" else raw


class ClientGone(Exception):
    """The client disconnected before sending its whole body."""
