"""Read a request body as a stream under a cap, decoding gzip or zstd with the same cap.

The cap applies to the decoded bytes; decoding stops at the cap, so a
decompression bomb is a 413, never an out-of-memory.
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import zstandard

from app.errors import InvalidRequest, TooLarge, UnsupportedEncoding
from app.text import ascii_digits

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
    if not ascii_digits(header):
        raise InvalidRequest("Content-Length is not a number")
    length = int(header)
    if length > cap:
        raise TooLarge(f"the body is {length} bytes, over the {cap}-byte limit")


def _too_large(cap: int) -> TooLarge:
    return TooLarge(f"the body is over the {cap}-byte limit")


class _Gzip:
    """Streaming gzip with a cap on the output; concatenated members included."""

    def __init__(self, cap: int) -> None:
        self._cap = cap
        self._out = bytearray()
        self._d = zlib.decompressobj(31)
        self._in_member = False  # the current member has had input

    def feed(self, data: bytes) -> None:
        while data:
            self._in_member = True
            room = self._cap - len(self._out) + 1
            try:
                chunk = self._d.decompress(data, room)
            except zlib.error as exc:
                raise InvalidRequest(f"the gzip body is corrupt: {exc}") from exc
            self._out += chunk
            if len(self._out) > self._cap:
                raise _too_large(self._cap)
            if self._d.eof:
                data = self._d.unused_data
                self._d = zlib.decompressobj(31)
                self._in_member = False
            else:
                data = self._d.unconsumed_tail
                if not data and not chunk:
                    break

    def finish(self) -> bytes:
        if self._in_member and not self._d.eof:
            tail = self._d.flush()
            self._out += tail
            if len(self._out) > self._cap:
                raise _too_large(self._cap)
            if not self._d.eof:
                raise InvalidRequest("the gzip body is truncated")
        return bytes(self._out)


def _zstd(compressed: bytes, cap: int) -> bytes:
    # stream_reader().read(n): a frame's declared size cannot be trusted.
    reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(compressed), read_across_frames=True)
    out = bytearray()
    try:
        while True:
            chunk = reader.read(min(1 << 20, cap - len(out) + 1))
            if not chunk:
                break
            out += chunk
            if len(out) > cap:
                raise _too_large(cap)
        # The capped read above bounds the output; this pass proves every frame is whole
        # (stream_reader returns a prefix of a truncated frame without complaint).
        _check_zstd_frames(compressed)
    except zstandard.ZstdError as exc:
        raise InvalidRequest(f"the zstd body is corrupt: {exc}") from exc
    return bytes(out)


def _check_zstd_frames(data: bytes) -> None:
    decompressor = zstandard.ZstdDecompressor()
    while data:
        frame = decompressor.decompressobj()
        frame.decompress(data)
        if not frame.eof:
            raise InvalidRequest("the zstd body is truncated")
        data = frame.unused_data


async def read_body(receive: Receive, encoding: str, cap: int) -> bytes:
    """The decoded body, or TooLarge as soon as the cap is passed."""
    gzip = _Gzip(cap) if encoding == "gzip" else None
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        data = message.get("body", b"")
        if data:
            if gzip is not None:
                gzip.feed(data)
            else:
                size += len(data)
                if size > cap:
                    raise _too_large(cap)
                chunks.append(data)
        if not message.get("more_body", False):
            break
    if gzip is not None:
        return gzip.finish()
    raw = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    return _zstd(raw, cap) if encoding == "zstd" else raw


class ClientGone(Exception):
    """The client disconnected before sending its whole body."""
