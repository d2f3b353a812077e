"""uvicorn's private names that app/server.py builds on are still there.

HttpProtocol subclasses uvicorn's httptools protocol: it overrides the parser's callbacks and
reads the connection's state; Server overrides ``capture_signals``. None of that is uvicorn's
public API, and a 0.x release may change it, so pyproject.toml bounds uvicorn below its next
minor. When the bound is raised, these tests name what has gone; what the names do is tested
in tests/api/test_http_framing.py and tests/e2e/test_serve.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import signal
import socket
from collections.abc import Generator
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from app.server import HttpProtocol, Server

# The callbacks HttpProtocol overrides and calls on to (super()); uvicorn must still call them.
HOOKS = ("connection_made", "data_received", "on_headers_complete", "on_message_complete",
         "on_response_complete", "send_400_response", "connection_lost")
# What HttpProtocol reads or sets of a connection's state, once a request has been answered.
CONNECTION_STATE = ("loop", "transport", "server_state", "connections", "timeout_keep_alive", "pipeline",
                    "cycle", "url", "headers", "scope")
CYCLE_STATE = ("keep_alive", "response_started", "response_complete")
SERVER_STATE = ("default_headers", "total_requests")
UPGRADE = "raising uvicorn's bound in pyproject.toml needs app/server.py adapted first"


def test_the_callbacks_http_protocol_overrides_are_uvicorns_with_the_same_parameters() -> None:
    gone = [name for name in HOOKS if not callable(getattr(HttpToolsProtocol, name, None))]
    assert not gone, f"uvicorn {uvicorn.__version__}'s HttpToolsProtocol has no {gone}; {UPGRADE}"
    assert all(name in vars(HttpProtocol) for name in HOOKS), "HOOKS is the list of what app/server.py overrides"
    changed = [name for name in HOOKS
               if list(inspect.signature(getattr(HttpToolsProtocol, name)).parameters)
               != list(inspect.signature(getattr(HttpProtocol, name)).parameters)]
    assert not changed, f"uvicorn {uvicorn.__version__} calls {changed} with other parameters; {UPGRADE}"


async def _hello(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]})
    await send({"type": "http.response.body", "body": b"hello"})


async def _one_request() -> tuple[HttpProtocol, bytes]:
    """One request over a loopback socket to HttpProtocol as uvicorn builds it: the protocol,
    and what the client read."""
    config = uvicorn.Config(_hello, lifespan="off", log_level="warning")
    config.load()
    state = ServerState()
    made: list[HttpProtocol] = []

    def connection() -> HttpProtocol:
        made.append(HttpProtocol(config=config, server_state=state, app_state={}))
        return made[-1]

    server = await asyncio.get_running_loop().create_server(connection, "127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: arbiter\r\n\r\n")
        answer = await asyncio.wait_for(reader.readuntil(b"hello"), 5)
        writer.close()
        await writer.wait_closed()
    finally:
        server.close()
    return made[0], answer


def test_the_connection_state_http_protocol_reads_is_there() -> None:
    protocol, answer = asyncio.run(_one_request())
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer
    for what, names in ((protocol, CONNECTION_STATE), (protocol.cycle, CYCLE_STATE),
                        (protocol.server_state, SERVER_STATE)):
        gone = [name for name in names if not hasattr(what, name)]
        assert not gone, f"uvicorn {uvicorn.__version__}'s {type(what).__name__} has no {gone}; {UPGRADE}"
    assert protocol.cycle.response_complete and protocol.server_state.total_requests == 1


def test_uvicorns_serve_takes_signals_through_capture_signals() -> None:
    """Server's capture_signals installs handle_exit (and so leaves out uvicorn's re-raising of
    SIGTERM after the shutdown): only while uvicorn's serve still enters it."""
    seen: list[Any] = []

    class Watched(Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Generator[None, None, None]:
            with super().capture_signals():
                seen.append(signal.getsignal(signal.SIGTERM))
                self.should_exit = True  # served nothing: stop at the first tick
                yield

    async def serve_briefly(server: Server, listening: socket.socket) -> None:
        with contextlib.suppress(TimeoutError):  # it runs on when capture_signals is not entered
            await asyncio.wait_for(server.serve(sockets=[listening]), 5)

    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    with listening:
        server = Watched(uvicorn.Config(_hello, lifespan="off", log_level="warning"))
        asyncio.run(serve_briefly(server, listening))
    assert seen == [server.handle_exit], (f"uvicorn {uvicorn.__version__}'s Server.serve no longer takes "
                                          f"signals through capture_signals; {UPGRADE}")
    assert signal.getsignal(signal.SIGTERM) is not server.handle_exit  # put back afterwards
