"""Running the app under uvicorn, with the exit an operator expects."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections import OrderedDict
from collections.abc import Generator
from http import HTTPStatus
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.api.public.openai_decisions import OPENAI_DECISIONS_PATH
from app.decisions.openai_api import errors as openai_errors
from app.errors import ArbiterError, BackendFailed, HeadersTooLarge, InvalidRequest, RequestTimeout
from app.main import create_app
from app.openfiles import (
    HEALTH_RESERVE,
    check_fits,
    connection_cap,
    open_file_limit,
    raise_open_file_limit,
)
from app.settings import Settings
from app.telemetry.metrics import Metrics

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Server(uvicorn.Server):
    """uvicorn re-raises SIGTERM after its graceful shutdown, so the process dies by the
    signal. A gateway that drained its requests and flushed its records exits 0 instead."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in _SIGNALS}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


class _CoalescingTransport:
    """A connection's transport that writes what a turn of the event loop produced in one call.

    uvicorn writes the status line and headers as soon as ``http.response.start`` comes and
    the body at ``http.response.body``: two sends, two packets, two wake-ups of the client
    for a small answer. Here writes are held and joined, and go out together once the loop has
    run what was ready (a ``call_soon``), so a streamed answer's head never waits for its first
    chunk, and answers that finish in the same turn leave one after the other, not spread over
    it (measured with bench/run.py: ~5% less CPU per decision, and a client woken less often).
    Past ``FLUSH_AT`` bytes the held data goes at once; a close writes what is held first, and
    so does the end of an answer (``HttpProtocol.on_response_complete``), so that what the route
    does after answering (metrics, the usage record) does not hold the answer back."""

    FLUSH_AT = 64 * 1024

    __slots__ = ("_flush_scheduled", "_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._flush_scheduled = False

    def write(self, data: bytes) -> None:
        held = self._held
        if held is None:
            self._held = bytes(data)
            if not self._flush_scheduled:
                self._flush_scheduled = True
                self._loop.call_soon(self._flush)
            return
        held += data
        if len(held) >= self.FLUSH_AT:  # a big answer: no need to wait, and no unbounded buffer
            self._held = None
            self._transport.write(held)
        else:
            self._held = held

    def writelines(self, lines: Any) -> None:
        self.write(b"".join(lines))

    def _flush(self) -> None:
        self._flush_scheduled = False
        held = self._held
        if held is not None:
            self._held = None
            if not self._transport.is_closing():
                self._transport.write(held)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + len(self._held or b"")

    def __getattr__(self, name: str) -> Any:  # is_closing, get_extra_info, pause_reading, ...
        return getattr(self._transport, name)


MAX_HEAD_BYTES = 64 * 1024


_HEAD_OVER = f"the request's header section is over the {MAX_HEAD_BYTES}-byte limit"

HEALTH_PATHS = (b"/healthz", b"/readyz")  # what a connection past the cap may still ask
MAX_REQUEST_LINE = 8 * 1024  # past the cap, the most bytes read looking for the request line


class _HeadRefused(Exception):
    """Raised from a parser callback to stop parsing a request that has been answered."""


class HttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, writing each whole response in one send (see above), with
    two limits on what a client sends, and its own malformed-request answers in Arbiter's JSON
    error shape (OpenAI's for a request to /v1/decisions whose head has arrived).

    - The header section: httptools buffers a header line until it ends, however long, so one
      connection sending an endless header would grow the process without bound. Bytes are
      counted as they arrive while a request's head is incomplete, up to its end within a read;
      a head that begins inside a read (after a pipelined request) is measured from what the
      parser kept once it is whole. Past ``MAX_HEAD_BYTES``: 431, and the connection closes,
      after the answers to the requests before it on the connection.
    - Time: a request must arrive whole (head and body) within ``client_timeout`` seconds of its
      first byte, or it is answered 408 and the connection closes; a client trickling a byte now
      and then (slowloris) would otherwise hold a connection, and a body's memory, for ever. A
      connection that sends no byte at all is closed, unanswered, ``client_timeout`` seconds
      after it opened (uvicorn times connections out only once they have been answered). Idle
      keep-alive connections after an answer: uvicorn's timer, set to ``keep_alive_timeout``.
      One timer a second per process checks every connection (``_sweep``), so a request pays
      one clock read.
    - Connections: at ``max_connections`` open, a new connection takes the place of the one idle
      the longest (no byte since it opened or since its last answer), which is closed, as nginx
      does: closing it loses nothing, and a flood of silent connections cannot starve clients
      that send. With none idle, the new connection is read only up to its request line:
      ``/healthz`` and ``/readyz`` are served (and the connection then closes), anything else
      is 503 with Retry-After and closes; past ``HEALTH_RESERVE`` more, it gets the 503 at once,
      unread. Descriptors stay bounded whatever a flood of connections does."""

    client_timeout = 60.0
    keep_alive_timeout = 5.0
    max_connections = connection_cap(None, 1 << 20)
    metrics: Metrics | None = None

    @classmethod
    def configured(cls, settings: Settings, metrics: Metrics | None = None) -> type[HttpProtocol]:
        """This protocol with ``settings``' limits; ``metrics`` counts connections (none: uncounted)."""
        return type(cls.__name__, (cls,), {
            "client_timeout": settings.client_timeout, "keep_alive_timeout": settings.keep_alive_timeout,
            "max_connections": connection_cap(settings.max_connections, open_file_limit()), "metrics": metrics})

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.transport = _CoalescingTransport(transport, self.loop)  # type: ignore[assignment]
        if not getattr(self.server_state, "arbiter_sweeping", False):
            self._watch_server()
        self._idle: OrderedDict[HttpProtocol, None] = self.server_state.arbiter_idle  # type: ignore[attr-defined]
        self.timeout_keep_alive = self.keep_alive_timeout  # type: ignore[assignment]  # uvicorn's int: any seconds do
        self._head_open = True
        self._head_bytes = 0
        self._tail = b""  # the last bytes of the open head's previous read (a CRLFCRLF may straddle)
        self._heads = 0  # heads completed on this connection
        self._refusal: ArbiterError | None = None  # sent once the answers before it are out
        # Loop time of the first byte of the request arriving; until a first byte, of the opening.
        self.request_started: float | None = self.loop.time()
        self._opening = True  # the first request is not let through yet (no byte, or no request line past the cap)
        self._first_line = b""  # past the cap: what came of the first request line
        over = len(self.connections) - self.max_connections
        if over > 0 and self._close_longest_idle():
            over = 0  # its place is this connection's
        self._past_cap = over > 0
        if over > HEALTH_RESERVE:
            self._refuse_connection()
            return
        self._idle[self] = None

    def _watch_server(self) -> None:
        """Once per server, at its first connection: the sweep, the connections idle (oldest first),
        and the gauge of open connections."""
        self.server_state.arbiter_sweeping = True  # type: ignore[attr-defined]
        self.server_state.arbiter_idle = OrderedDict()  # type: ignore[attr-defined]
        self.loop.call_later(1.0, _sweep, self.loop, self.connections)
        if self.metrics is not None:
            connections = self.connections
            self.metrics.connections_open.set_function(lambda: float(len(connections)))

    def data_received(self, data: bytes) -> None:
        if self._refusal is not None:
            return  # a refused request: nothing after it is read; the connection ends once it is answered
        if self._opening:
            data = self._opening_bytes(data)
            if not data:
                return
        elif self.request_started is None:
            self.request_started = self.loop.time()
            self._idle.pop(self, None)
        counted = self._head_open
        if counted and self._head_bytes + len(data) > MAX_HEAD_BYTES and not self._head_ends_in_time(data):
            self._refuse_next(HeadersTooLarge(_HEAD_OVER))
            return  # not parsed: the head is over the cap wherever it ends
        heads = self._heads
        super().data_received(data)
        if counted and self._heads == heads:  # the head that was open is open still
            self._head_bytes += len(data)
            self._tail = data[-3:]

    def _opening_bytes(self, data: bytes) -> bytes:
        """The first bytes of a connection, and what of them goes on to the parser: all of them, or,
        past the cap, nothing until the request line is whole, and then only a health check's."""
        if not self._first_line:
            self.request_started = self.loop.time()  # the request's clock starts at its first byte
            self._idle.pop(self, None)
        if not self._past_cap:
            self._opening = False
            return data
        held = self._first_line + data
        end = held.find(b"\r\n")
        if end < 0 and len(held) <= MAX_REQUEST_LINE:
            self._first_line = held
            return b""
        if end >= 0 and _asks_health(held[:end]):
            self._opening = False
            self._first_line = b""
            return held
        self._refuse_connection()
        return b""

    def _close_longest_idle(self) -> bool:
        """Close the connection idle the longest, if there is one, to make room for this one."""
        while self._idle:
            connection, _ = self._idle.popitem(last=False)
            if not connection.transport.is_closing():
                connection.transport.close()
                if self.metrics is not None:
                    self.metrics.connections_idle_closed.inc()
                return True
        return False

    def _refuse_connection(self) -> None:
        if self.metrics is not None:
            self.metrics.connections_refused.inc()
        error = BackendFailed(503, f"Arbiter is at its limit of {self.max_connections} open connections; "
                                   "try again shortly", retry_after=1)
        self._refusal = error  # nothing more is read
        self._refuse(error, known_path=False)

    def _head_ends_in_time(self, data: bytes) -> bool:
        """Whether the head open at the start of ``data`` ends (CRLFCRLF: httptools takes no bare
        LF) within the cap. Counted in bytes as they came: whitespace the parser drops counts."""
        window = self._tail + data[: MAX_HEAD_BYTES - self._head_bytes]
        return window.find(b"\r\n\r\n") >= 0

    def on_headers_complete(self) -> None:
        self._head_open = False
        self._head_bytes = 0
        self._tail = b""
        self._heads += 1
        # A head that began inside a read (after the request before it, pipelined) was not counted
        # as it came: its size from what the parser kept (whitespace around values left out).
        size = len(self.url)
        for name, value in self.headers:
            size += len(name) + len(value) + 4  # ": " and CRLF
        if size > MAX_HEAD_BYTES:
            self._refuse_next(HeadersTooLarge(_HEAD_OVER))
            raise _HeadRefused  # stops the parser here: the body is never read
        super().on_headers_complete()
        if self._past_cap:  # a health check past the cap: answered, then the connection closes
            self.cycle.keep_alive = False

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._head_open = True
        self.request_started = None

    def time_out(self) -> None:
        """The request did not arrive whole in time: 408 unless its answer has begun, then close."""
        if self.transport.is_closing() or self._refusal is not None:
            return
        if self._opening and not self._first_line:  # not a byte came: there is no request to answer
            self.transport.close()
            return
        answering = not self._head_open and self.cycle is not None and self.cycle.response_started
        if answering:  # the route answered before the body was whole (a 413, say): just close
            self.transport.close()
            return
        self._refuse(RequestTimeout(f"the request did not arrive whole within {self.client_timeout:g}s"))

    def send_400_response(self, msg: str) -> None:
        if self.transport.is_closing() or self._refusal is not None:  # already refused (a head over the cap)
            return
        # uvicorn's answer to a request it cannot parse (a malformed request line, a
        # Content-Length that is not a number, ...), in the shape every client of Arbiter reads.
        self._refuse(InvalidRequest(f"invalid HTTP request: {msg}"))

    def _refuse_next(self, error: ArbiterError) -> None:
        """Refuse the request now arriving, whose path is not known: at once, or, when requests
        before it on this connection (pipelined) are not answered yet, after their answers, which
        the client reads in order (a 431 read as the answer to a request that was served would
        have the client send it again)."""
        if self._refusal is not None or self.transport.is_closing():
            return
        if (self.cycle is not None and not self.cycle.response_complete) or self.pipeline:
            self._refusal = error
        else:
            self._refuse(error, known_path=False)

    def _refuse(self, error: ArbiterError, *, known_path: bool = True) -> None:
        # Once the request's head is whole its path is known, and /v1/decisions answers every
        # error in OpenAI's shape; before that (a head over the cap, a malformed request line)
        # the endpoint is unknown, and the answer is in Arbiter's.
        scope: Any = self.scope
        path = scope.get("path") if scope is not None and known_path else None
        body = openai_errors.from_arbiter(error) if path == OPENAI_DECISIONS_PATH else error.body()
        head = [b"HTTP/1.1 %d %s\r\n" % (error.status, HTTPStatus(error.status).phrase.encode())]
        head.extend(b"%s: %s\r\n" % pair for pair in self.server_state.default_headers)
        head.extend(b"%s: %s\r\n" % (name.encode(), value.encode()) for name, value in error.headers.items())
        head.append(b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
                    % len(body))
        self.transport.write(b"".join(head) + body)
        self.transport.close()

    def on_response_complete(self) -> None:
        # The answer is whole: it goes out now, not after what the route does once it has
        # answered (metrics, the usage record, the access line), which is off the client's clock.
        self.transport._flush()  # type: ignore[attr-defined]
        if self._refusal is not None and not self.pipeline:  # every request before the refused one answered
            self.server_state.total_requests += 1
            self._refuse(self._refusal, known_path=False)
            return
        super().on_response_complete()
        if self.request_started is None and not self.pipeline and not self.transport.is_closing():
            self._idle[self] = None  # kept alive, waiting for the next request

    def connection_lost(self, exc: Exception | None) -> None:
        self._idle.pop(self, None)
        super().connection_lost(exc)


def _sweep(loop: asyncio.AbstractEventLoop, connections: set[Any]) -> None:
    """Once a second: time out the requests that have been arriving for too long."""
    now = loop.time()
    for connection in list(connections):
        started = getattr(connection, "request_started", None)
        if started is not None and now - started > connection.client_timeout:
            connection.time_out()
    loop.call_later(1.0, _sweep, loop, connections)


def _asks_health(request_line: bytes) -> bool:
    """Whether a request line (``GET /healthz?x HTTP/1.1``) asks for a health check."""
    parts = request_line.split(b" ")
    return len(parts) == 3 and parts[1].split(b"?", 1)[0] in HEALTH_PATHS


def serve(settings: Settings) -> None:
    # log_config=None: uvicorn's loggers keep the JSON handler `configure` gave them (app/telemetry/logs.py)
    # instead of its own plain-text set-up. proxy_headers=False: the app applies them (see main.py).
    open_files = raise_open_file_limit()  # before anything opens: the connection cap is sized under it
    app = create_app(settings)
    app.route_templates.resolve()  # FastAPI's route contexts, before serving (app/main.py RouteTemplates)
    protocol = HttpProtocol.configured(settings, app.components.metrics)
    if settings.max_connections is not None:
        check_fits(settings.max_connections, open_files)
    config = uvicorn.Config(app, host=settings.host, port=settings.port, loop="uvloop",
                            http=protocol, lifespan="on", access_log=False, log_level="warning",
                            log_config=None, timeout_graceful_shutdown=30, proxy_headers=False)
    logging.getLogger("arbiter.server").info("serving on http://%s:%d (at most %d connections; open-file limit %d)",
                                             settings.host, settings.port, protocol.max_connections, open_files)
    Server(config).run()
