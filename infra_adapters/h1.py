"""A lean HTTP/1.1 client for the one call on the hot path: POST a JSON body, read the whole answer.

Why not aiohttp here: a decision is one small POST and one small answer, and aiohttp's general
machinery (yarl URLs, multidict headers, cookie jar, trace hooks, a StreamReader per answer)
cost ~60 µs of CPU per call in the benchmark, about a quarter of the gateway's own time. This
client keeps a pool of keep-alive connections per backend, writes each request in one write
from a pre-encoded head, and parses the answer with httptools (llhttp, the parser uvicorn
uses). Streaming answers (chat, pulls) stay on aiohttp (``infra_adapters/http.py``).

Behaviour kept from the aiohttp path it replaces: redirects are never followed, a POST is never
retried on another connection (it may have been processed), the answer is capped (declared and
actual size), a gzip/deflate answer is decoded, and every failure is one of the BackendError
tree with the same meaning: could not connect (BackendUnreachable), no whole answer in time
(BackendTimeout), the connection broke or the answer was malformed (BackendBroken).
"""

from __future__ import annotations

import asyncio
import ssl
import time
import zlib
from collections import deque
from urllib.parse import urlsplit

import httptools

from infra_adapters.base import (
    BackendBroken,
    BackendTimeout,
    BackendUnreachable,
    Reply,
    ReplyTooLarge,
)

__all__ = ["H1Pool"]

KEEPALIVE_SECONDS = 15.0  # an idle connection older than this is closed, not reused (aiohttp's default)
# An answer's status line and headers: past this many bytes the answer is broken. httptools has no
# limit of its own, and joins a header value's pieces at a cost that grows with their square.
MAX_HEAD_BYTES = 64 * 1024


class H1Pool:
    """Keep-alive connections to one origin (scheme, host, port), at most ``limit`` at a time."""

    def __init__(self, url: str, *, connect_timeout: float, limit: int) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.url = url.rstrip("/")
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._ssl: ssl.SSLContext | None = ssl.create_default_context() if parts.scheme == "https" else None
        self._prefix = parts.path.rstrip("/")
        default_port = parts.port is None or parts.port == (443 if parts.scheme == "https" else 80)
        host = f"[{self._host}]" if ":" in self._host else self._host
        self._host_header = host if default_port else f"{host}:{self._port}"
        self._connect_timeout = connect_timeout
        self._limit = max(1, limit)
        self._idle: list[_Connection] = []
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._heads: dict[tuple[str, tuple[tuple[str, str], ...]], bytes] = {}
        self.open_connections = 0  # connected or connecting
        self.busy = 0  # checked out for a request
        self._closed = False

    def head(self, path: str, headers: tuple[tuple[str, str], ...]) -> bytes:
        """The request line and the fixed headers of a POST to ``path`` (cached: built once)."""
        key = (path, headers)
        head = self._heads.get(key)
        if head is None:
            lines = [f"POST {self._prefix}{path} HTTP/1.1", f"Host: {self._host_header}"]
            lines += [f"{name}: {_checked(value)}" for name, value in headers]
            head = ("\r\n".join(lines) + "\r\n").encode("latin-1")
            if len(self._heads) < 64:
                self._heads[key] = head
        return head

    async def post(self, path: str, head: bytes, headers: dict[str, str], data: bytes, timeout: float,
                   limit: int) -> Reply:
        """POST ``data`` (``head`` from ``head()``, ``headers`` the per-request ones) and read the answer.

        ``timeout`` bounds the whole exchange, connecting included; ``limit`` caps the answer."""
        url = self.url + path
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        extra = "".join([f"{name}: {_checked(value)}\r\n" for name, value in headers.items()])
        request = b"".join((head, extra.encode("latin-1"), b"Content-Length: %d\r\n\r\n" % len(data), data))
        await self._acquire(url, timeout, deadline)
        connection: _Connection | None = None
        try:
            connection = self._take_idle()
            if connection is None:
                connection = await self._connect(loop, url, timeout, deadline)
            reply = await connection.exchange(loop, request, url, timeout, deadline, limit)
        except BaseException:
            if connection is not None:
                connection.close()  # in an unknown state: never reused
            self._release(None)
            raise
        if not connection.reusable:
            connection.close()
        self._release(connection if connection.reusable else None)
        return reply

    async def _acquire(self, url: str, timeout: float, deadline: float) -> None:
        if self.busy < self._limit and not self._waiters:
            self.busy += 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter, max(0.0, deadline - asyncio.get_running_loop().time()))
        except BaseException as exc:
            # A slot handed to us just as we gave up (a cancel, or a timeout that Python 3.12+ raises
            # even when the waiter got its result in the same turn): pass it on, never lose it.
            if waiter.done() and not waiter.cancelled():
                self._release(None)
            if isinstance(exc, TimeoutError):
                raise BackendTimeout(f"{url} did not answer within {timeout:g}s (every connection busy)") from exc
            raise
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
        # the slot was handed over with the count already taken

    def _release(self, connection: _Connection | None) -> None:
        if connection is not None:
            if self._closed:  # the pool was closed while this request ran
                connection.close()
            else:
                connection.idle_since = time.monotonic()
                self._idle.append(connection)
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot goes to the waiter: busy stays as it is
                return
        self.busy -= 1

    def _take_idle(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()  # the most recently used: warm, least likely closed
            if connection.usable and not connection.closing and now - connection.idle_since < KEEPALIVE_SECONDS:
                return connection
            connection.close()
        return None

    async def _connect(self, loop: asyncio.AbstractEventLoop, url: str, timeout: float,
                       deadline: float) -> _Connection:
        # As aiohttp's ClientTimeout(total=timeout, connect=min(connect, timeout)): running out of
        # the connect time is "unreachable"; running out of the whole budget first (after a wait
        # for a free connection) is a timeout.
        left = max(0.0, deadline - loop.time())
        bounded_by_total = left < self._connect_timeout
        connection = _Connection(self)
        try:
            await asyncio.wait_for(
                loop.create_connection(lambda: connection, self._host, self._port, ssl=self._ssl,
                                       server_hostname=self._host if self._ssl else None),
                min(self._connect_timeout, left))
        except TimeoutError as exc:
            if bounded_by_total and left < timeout - 1e-3:  # part of it went waiting for a slot
                raise BackendTimeout(f"{url} did not answer within {timeout:g}s") from exc
            raise BackendUnreachable(f"cannot connect to {url}: timed out") from exc
        except OSError as exc:
            raise BackendUnreachable(f"cannot connect to {url}: {exc}") from exc
        return connection

    def _forget(self, connection: _Connection) -> None:
        if connection.counted:
            connection.counted = False
            self.open_connections -= 1
        if connection in self._idle:
            self._idle.remove(connection)

    def close(self) -> None:
        """Close every idle connection; one in use is closed when its request ends."""
        self._closed = True
        for connection in self._idle:
            connection.close()
        self._idle.clear()


def _checked(value: str) -> str:
    if "\r" in value or "\n" in value:
        raise ValueError("newline or carriage return in a header value")
    return value


class _Connection(asyncio.Protocol):
    """One keep-alive connection, one request at a time."""

    def __init__(self, pool: H1Pool) -> None:
        self._pool = pool
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[Reply] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._url = ""
        self._limit = 0
        self._parts: list[bytes] = []
        self._size = 0
        self._content_type: str | None = None
        self._retry_after: str | None = None
        self._encoding: str | None = None
        self._length: int | None = None
        self._chunked = False
        self._headers_done = False  # the final (not 1xx) answer's headers are complete
        self._head_bytes = 0  # bytes received while the answer's headers were incomplete
        self._failure: BaseException | None = None
        self.reusable = False
        self.usable = False  # connected and not closed
        self.counted = False
        self.idle_since = 0.0

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self.usable = True
        self.counted = True
        self._pool.open_connections += 1

    def data_received(self, data: bytes) -> None:
        if self._waiter is None or self._waiter.done():
            self.close()  # bytes nobody asked for: the connection is out of step
            return
        if not self._headers_done:
            if self._head_bytes > MAX_HEAD_BYTES:
                self._fail(BackendBroken(f"{self._url} sent more than {MAX_HEAD_BYTES} bytes of headers"))
                return
            self._head_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # 101 Switching Protocols: not an answer to a POST
            self._fail(BackendBroken(f"{self._url} answered by switching protocols"))
        except httptools.HttpParserError as exc:  # a callback's _Abort arrives as one too
            self._fail(BackendBroken(f"{self._url} sent a malformed answer: {exc}"))  # no-op after _Abort

    def eof_received(self) -> bool | None:
        return False  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.usable = False
        self._pool._forget(self)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            if self._headers_done and self._length is None and not self._chunked and exc is None:
                self._complete()  # an answer delimited by the end of the connection
            else:
                reason = "ServerDisconnectedError" if exc is None else type(exc).__name__
                self._fail(BackendBroken(f"{self._url} broke the connection: {reason}"), close=False)

    # -- httptools callbacks ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            # An answer nobody asked for, right behind the real one: never let it (or part of it)
            # become the next request's answer.
            self.reusable = False
            self.close()
            raise _Abort

    def _reset(self) -> None:
        """Forget an answer's framing and parts: at each exchange, and after an interim answer."""
        self._parts = []
        self._size = 0
        self._content_type = self._encoding = self._retry_after = None
        self._length = None
        self._chunked = False
        self._headers_done = False

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._headers_done:
            return  # a chunked answer's trailers: they never replace its headers
        lower = name.lower()
        if lower == b"content-type":
            self._content_type = value.decode("latin-1")
        elif lower == b"content-length":
            try:
                self._length = int(value)
            except ValueError:
                self._length = None
        elif lower == b"transfer-encoding":
            self._chunked = b"chunked" in value.lower()
        elif lower == b"content-encoding":
            self._encoding = value.decode("latin-1").strip().lower()
        elif lower == b"retry-after":
            self._retry_after = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        if self._parser.get_status_code() < 200:
            return  # an interim answer (100 Continue): the real one follows
        self._headers_done = True
        if self._length is not None and self._length > self._limit:
            self._fail(ReplyTooLarge(f"{self._url} answered {self._length} bytes, over the "
                                     f"{self._limit}-byte response cap"))
            raise _Abort

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._size > self._limit:
            self._fail(ReplyTooLarge(f"{self._url} answered more than the {self._limit}-byte response cap"))
            raise _Abort
        self._parts.append(body)

    def on_message_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200:
            self._reset()  # an interim answer (100 Continue): the real one follows
            return
        self._complete()

    # -- the exchange --------------------------------------------------------------------------

    async def exchange(self, loop: asyncio.AbstractEventLoop, request: bytes, url: str, timeout: float,
                       deadline: float, limit: int) -> Reply:
        self._url = url
        self._limit = limit
        self.reusable = False
        self._failure = None
        self._reset()  # nothing of the last answer on this connection counts for this one
        self._head_bytes = 0
        waiter = self._waiter = loop.create_future()
        self._timer = loop.call_at(deadline, self._time_out, timeout)
        try:
            assert self._transport is not None
            self._transport.write(request)
            return await waiter
        finally:
            self._timer.cancel()
            self._timer = None
            self._waiter = None

    def _time_out(self, timeout: float) -> None:
        self._fail(BackendTimeout(f"{self._url} did not answer within {timeout:g}s"))

    def _complete(self) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        body = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
        self._parts = []
        if self._encoding in ("gzip", "x-gzip", "deflate"):
            try:
                body = _decode(body, self._encoding, self._limit)
            except (zlib.error, ReplyTooLarge) as exc:
                failure = exc if isinstance(exc, ReplyTooLarge) else BackendBroken(
                    f"{self._url} sent a malformed answer: cannot decode {self._encoding}: {exc}")
                self._fail(failure)
                return
        self.reusable = self.usable and self._parser.should_keep_alive()
        waiter.set_result(Reply(self._parser.get_status_code(), self._content_type, body, self._retry_after))

    def _fail(self, error: BaseException, *, close: bool = True) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)
        self.reusable = False
        if close:
            self.close()

    @property
    def closing(self) -> bool:
        return self._transport is None or self._transport.is_closing()

    def close(self) -> None:
        self.usable = False
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()


class _Abort(Exception):
    """Raised from a parser callback to stop parsing an answer that has already failed."""


def _decode(body: bytes, encoding: str, limit: int) -> bytes:
    decoder = zlib.decompressobj(31 if encoding in ("gzip", "x-gzip") else zlib.MAX_WBITS)
    try:
        out = decoder.decompress(body, limit + 1)
    except zlib.error:
        if encoding != "deflate":
            raise
        decoder = zlib.decompressobj(-zlib.MAX_WBITS)  # raw deflate, as some servers send it
        out = decoder.decompress(body, limit + 1)
    if len(out) > limit:
        raise ReplyTooLarge(f"the decoded answer is over the {limit}-byte response cap")
    if not decoder.eof:
        raise zlib.error("the compressed answer is cut short")
    return out
