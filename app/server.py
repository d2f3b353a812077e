"""Running the app under uvicorn, with the exit an operator expects."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Generator

import uvicorn

from app.main import create_app
from app.settings import Settings

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


def serve(settings: Settings) -> None:
    config = uvicorn.Config(create_app(settings), host=settings.host, port=settings.port, loop="uvloop",
                            http="httptools", lifespan="on", access_log=False, log_level="warning",
                            timeout_graceful_shutdown=30)
    Server(config).run()
