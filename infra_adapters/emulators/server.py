"""Run an aiohttp application as a real HTTP server for tests and for the CLI.

`EmulatorServer` serves the app on its own event loop in a daemon thread, so
synchronous tests (and a gateway under test in another loop or process) can
talk to it over real sockets. It can be stopped and started again on the same
port, which is how tests take a backend down mid-run and bring it back.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import weakref
from types import TracebackType
from typing import Self

from aiohttp import web

# How long stop() waits for in-flight handlers before closing their
# connections. Hanging handlers (fault injection) are cancelled after this.
_log = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT = 0.25
START_TIMEOUT = 10.0


class EmulatorServer:
    """An aiohttp `web.Application` listening on `host:port` in a daemon thread.

    `port=0` picks a free port on the first `start()`; later starts reuse it.
    """

    def __init__(self, app: web.Application, host: str = "127.0.0.1", port: int = 0) -> None:
        self.app = app
        self.host = host
        self._port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._accepted: weakref.WeakSet[socket.socket] = weakref.WeakSet()  # see _Listener
        self._lock = threading.Lock()

    # -- properties ---------------------------------------------------------
    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self._port}"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- lifecycle ----------------------------------------------------------
    def start(self) -> Self:
        """Start listening; returns once the socket accepts connections."""
        with self._lock:
            if self.running:
                return self
            loop = asyncio.new_event_loop()
            ready = threading.Event()
            failure: list[BaseException] = []

            async def _setup() -> None:
                _detach_loop(self.app)
                runner = web.AppRunner(
                    self.app,
                    handle_signals=False,
                    access_log=None,
                    shutdown_timeout=SHUTDOWN_TIMEOUT,
                    handler_cancellation=True,
                )
                await runner.setup()
                try:
                    listener = _Listener.bound(self.host, self._port, self._accepted)
                    site = web.SockSite(runner, listener)
                    await site.start()
                except BaseException:
                    await runner.cleanup()
                    raise
                self._runner = runner
                self._port = int(runner.addresses[0][1])

            def _run() -> None:
                asyncio.set_event_loop(loop)
                try:
                    loop.run_until_complete(_setup())
                except Exception as exc:  # noqa: BLE001 - re-raised by start()
                    failure.append(exc)
                    ready.set()
                    loop.close()
                    return
                ready.set()
                try:
                    loop.run_forever()
                finally:
                    _drain(loop)
                    loop.close()

            thread = threading.Thread(target=_run, name=f"emulator-{self._port}", daemon=True)
            thread.start()
            if not ready.wait(START_TIMEOUT):
                raise RuntimeError("emulator server did not start in time")
            if failure:
                thread.join(1.0)
                raise failure[0]
            self._loop = loop
            self._thread = thread
            return self

    def stop(self) -> None:
        """Close the listener and every open connection, then join the thread."""
        with self._lock:
            loop, thread, runner = self._loop, self._thread, self._runner
            self._loop = self._thread = self._runner = None
            if loop is None or thread is None:
                return
            if runner is not None and not loop.is_closed():
                future = asyncio.run_coroutine_threadsafe(runner.cleanup(), loop)
                try:
                    future.result(timeout=SHUTDOWN_TIMEOUT + 5.0)
                except (TimeoutError, RuntimeError, OSError) as exc:
                    _log.warning("emulator %s: unclean shutdown: %r", self.url, exc)
            if not loop.is_closed():
                loop.call_soon_threadsafe(loop.stop)
            thread.join(5.0)
            for connection in list(self._accepted):  # what the loop's close left open
                connection.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<EmulatorServer {self.url} {state}>"


class _Listener(socket.socket):
    """The listening socket, keeping (weakly) every connection it accepts. A connection accepted
    as the server stops can have its transport made after aiohttp's cleanup closed the ones it
    knew, and closing a loop closes no socket: its client would wait out its whole timeout on it.
    ``stop`` closes whatever is still open once the loop is gone."""

    _accepted: weakref.WeakSet[socket.socket]

    @classmethod
    def bound(cls, host: str, port: int, accepted: weakref.WeakSet[socket.socket]) -> _Listener:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        listener = cls(family, kind, proto)
        listener._accepted = accepted
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(address)
        except OSError:  # the port is taken: start() reports it, and no socket is left open
            listener.close()
            raise
        return listener

    def accept(self) -> tuple[socket.socket, object]:
        connection, address = super().accept()
        self._accepted.add(connection)
        return connection, address


def _detach_loop(app: web.Application) -> None:
    """Let an app that ran on a previous (now closed) loop run on a new one.

    aiohttp binds an Application to the first loop that runs it; a restart
    uses a fresh loop in a fresh thread, so the binding is cleared first.
    """
    old = getattr(app, "_loop", None)
    if old is not None and old.is_closed():
        app._loop = None  # aiohttp offers no public way to rebind an app
        for sub in getattr(app, "_subapps", []):
            _detach_loop(sub)


def _drain(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel whatever is still pending on a stopped loop and let it finish."""
    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())


def serve_forever(app: web.Application, host: str = "127.0.0.1", port: int = 0) -> None:
    """Serve `app` in the current thread until interrupted (SIGINT / SIGTERM)."""
    web.run_app(
        app,
        host=host,
        port=port,
        shutdown_timeout=SHUTDOWN_TIMEOUT,
        handler_cancellation=True,
        access_log=None,
        print=lambda msg: print(msg, flush=True),
    )
