"""Test support: Arbiter in a thread on a free port, provisioning, and the one helper
that asserts SPEC §1's error shape."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import io
import itertools
import os
import random
import socket
import sys
import threading
import time
import traceback
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import uvicorn

from app.db.models import Service
from app.db.session import Database
from app.main import create_app
from app.server import HttpProtocol
from app.services import service as services
from app.services.sync import itself
from app.settings import Settings
from app.tenancy import service as tenancy
from app.tenancy.keys import KeyHasher
from app.tenancy.service import CLI
from infra_adapters.admin import admin_tls

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 415: "unsupported_error",
               429: "rate_limit_error", 500: "upstream_auth_error", 502: "backend_error",
               503: "backend_error", 504: "backend_error"}


def assert_error(response: httpx.Response, status: int, error_type: str | None = None) -> dict[str, Any]:
    """The response is an Arbiter error of ``status`` with both ``error`` and ``detail``."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error", "detail"}, body
    assert isinstance(body["error"], str) and body["error"]
    expected = error_type or ERROR_TYPES[status]
    if isinstance(body["detail"], list):
        assert expected == "invalid_request_error" and status == 400
        for item in body["detail"]:
            assert set(item) == {"loc", "msg", "type"}, item
            assert item["loc"][0] in ("body", "path", "query", "header"), item
    else:
        assert body["detail"] == {"error_type": expected, "message": body["error"]}, body
    return body


def body(response: httpx.Response, status: int) -> Any:
    """The JSON of ``response``, once it is checked to have ``status``."""
    assert response.status_code == status, (response.status_code, response.text)
    return response.json()


def redis_url(slot: int) -> str:
    """Redis database ``slot`` (0-2) of this pass's own: CI runs the SQLite and the PostgreSQL
    passes at once, and a test that empties its database must not empty the other pass's."""
    first = 10 if os.environ.get("ARBITER_TEST_DATABASE_URL", "").startswith("postgres") else 13
    first = int(os.environ.get("ARBITER_TEST_REDIS_FIRST_DB", first))  # a third suite at once elsewhere
    return f"redis://127.0.0.1:6379/{first + slot}"


def tampered(key: str) -> str:
    """``key`` with its last character changed: always a different key."""
    return key[:-1] + ("A" if key[-1] != "A" else "B")


# Ports for servers a test starts itself (``arbiter serve`` in a process of its own) and for
# backends that are away. A port picked by binding port 0 is from Linux's ephemeral range
# (32768-60999), where every outgoing connection takes its local port too: between the pick and
# the server's bind, one of the thousands of connections a suite makes (or the other CI pass)
# could take it. These come from below that range, from a band of this pass's own, each handed
# out once per run (a counter from a random start), and checked free.
_BAND = (26000, 31999) if os.environ.get("ARBITER_TEST_DATABASE_URL", "").startswith("postgres") else (20000, 25999)
_next_port = itertools.count(random.randrange(_BAND[1] - _BAND[0]))
_port_lock = threading.Lock()


def free_port() -> int:
    """A loopback port nothing listens on, that nothing else will take before the test binds it."""
    span = _BAND[1] - _BAND[0] + 1
    with _port_lock:
        for _ in range(span):
            port = _BAND[0] + next(_next_port) % span
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
            return port
    raise RuntimeError(f"no free port in {_BAND[0]}-{_BAND[1]}")


def closed_port() -> int:
    """A loopback port that nothing listens on (a backend that is away)."""
    return free_port()


class _PromptServer(uvicorn.Server):
    """uvicorn's server, without its fixed pauses at the end: its main loop looks at the stop flag
    every 0.1 s, and its shutdown sleeps 0.1 s, then polls every 0.1 s; a pass starts and stops a
    gateway about a thousand times. Here ``stop`` wakes the main loop at once, and the shutdown
    polls every 10 ms. It waits for the same things, in the same order: the listening socket
    closed, every connection asked to close and closed (up to the graceful timeout, then the
    requests' tasks cancelled), then the app's lifespan shutdown. `arbiter serve` keeps
    uvicorn's own (app/server.py), and tests/e2e stops it with signals."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    def stop(self) -> None:
        self.should_exit = True
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: it is stopped already
                loop.call_soon_threadsafe(self._wake.set)

    async def main_loop(self) -> None:
        self._loop = asyncio.get_running_loop()
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 1) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), 0.1)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        state = self.server_state
        for connection in list(state.connections):
            connection.shutdown()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.config.timeout_graceful_shutdown or 30)
        while (state.connections or state.tasks) and not self.force_exit and loop.time() < deadline:
            await asyncio.sleep(0.01)
        for task in state.tasks:
            task.cancel()
        if not self.force_exit:
            await self.lifespan.shutdown()


class Gateway:
    """Arbiter served by uvicorn in a daemon thread, on a free loopback port."""

    def __init__(self, settings: Settings, tracer_provider: Any = None) -> None:
        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        self.port = self._socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        # The port it really serves on (a mesh node announces its URL from it).
        self.settings = settings = settings.model_copy(update={"port": self.port})
        self.app = create_app(settings, tracer_provider=tracer_provider)
        protocol = HttpProtocol.configured(settings, self.app.components.metrics)
        config = uvicorn.Config(self.app, lifespan="on", log_level="warning", access_log=False,
                                loop="asyncio", http=protocol,  # as `arbiter serve`
                                proxy_headers=False,  # as there: the app applies them (app/main.py)
                                timeout_graceful_shutdown=5)  # well inside stop()'s 30 s
        self._server = _PromptServer(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]},
                                        daemon=True)

    def start(self) -> Gateway:
        self._thread.start()
        deadline = time.monotonic() + 15
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("Arbiter did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.stop()
        # Its graceful shutdown (5 s, above), then its lifespan's (a service sync under way gives
        # up its backend call: quick).
        self._thread.join(timeout=30)
        self._socket.close()
        if self._thread.is_alive():  # it would go on into the next test, with its database
            frame = sys._current_frames().get(self._thread.ident or 0)
            where = "".join(traceback.format_stack(frame)) if frame is not None else "?"
            loop = self._server._loop
            for task in list(asyncio.all_tasks(loop)) if loop is not None else []:  # what it awaits
                stack = io.StringIO()
                task.print_stack(file=stack)
                where += "\n" + stack.getvalue()
            raise RuntimeError(f"Arbiter on {self.url} did not stop within 30 s; its thread is at:\n{where}")

    def client(self, key: str | None = None, **kwargs: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        kwargs.setdefault("verify", admin_tls())  # one TLS context: httpx makes one per client, at ~20 ms each
        return httpx.Client(base_url=self.url, headers=headers, timeout=kwargs.pop("timeout", 30), **kwargs)


def synced(gateway: Gateway) -> Gateway:
    """``gateway`` once its start-up sync has read every service: a test that changes a backend
    (its models, a fault, a stop) then does not race that read."""
    wait_for(lambda: gateway.app.components.sync.runs >= 1)
    return gateway


def start_gateway(database_url: str, tracer_provider: Any = None, **overrides: Any) -> Gateway:
    values: dict[str, Any] = {"database_url": database_url, "registry_refresh_interval": 0.2,
                              "flush_interval": 0.1,
                              # Tests send bad keys by the dozen from one address; the throttle's
                              # own tests turn it on (tests/api/admin/test_failed_key_throttle.py).
                              "auth_failure_limit": 0,
                              # Tests poll /v1/usage until the ledger has written; the per-key rate of
                              # usage reads has its own tests (tests/api/test_usage_reads.py).
                              "usage_reads_per_minute": 0, **overrides}
    return Gateway(Settings(**values), tracer_provider).start()


@dataclass
class Stack:
    """A provisioned deployment: project 'acme' (all models), its key, and an admin key."""

    db: Database
    project_key: str
    admin_key: str
    gateway: Any = None
    ollama: Any = None
    ollama_state: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def provision(cls, db: Database, *, ollama_url: str | None = None, vllm_url: str | None = None,
                  models: Any = "all") -> Stack:
        hasher = KeyHasher()
        settings = Settings(database_url=db.url)
        if ollama_url:
            add_service(db, settings, type="ollama-external", url=ollama_url, name="ollama")
        if vllm_url:
            add_service(db, settings, type="vllm", url=vllm_url, name="vllm")
        with db.session() as session:
            tenancy.create_project(session, "acme", CLI, models=models)
            _, project_key = tenancy.create_key(session, hasher, CLI, kind="project", project="acme")
            _, admin_key = tenancy.create_key(session, hasher, CLI, kind="admin")
        return cls(db=db, project_key=project_key, admin_key=admin_key)

    def new_project(self, name: str, models: Any = "all") -> str:
        with self.db.session() as session:
            tenancy.create_project(session, name, CLI, models=models)
            return tenancy.create_key(session, KeyHasher(), CLI, kind="project", project=name)[1]

    def client(self, key: str | None = "project", **kwargs: Any) -> httpx.Client:
        value = {"project": self.project_key, "admin": self.admin_key}.get(key or "", key)
        return self.gateway.client(value, **kwargs)


def decision(model: str = "nimble", **extra: Any) -> dict[str, Any]:
    """A valid System One request with all three question types."""
    body: dict[str, Any] = {
        "model": model,
        "state": {"ticket": "My card was charged twice."},
        "questions": {
            "team": {"type": "choice", "instructions": "Which team?",
                     "criteria": {"billing": "payments and refunds", "shipping": None}},
            "urgent": {"type": "noul", "instructions": "Reply within the hour?",
                       "criteria": {"true": "money is moving"}},
            "tone": {"type": "score", "instructions": "How upset?",
                     "criteria": ["calm", "annoyed", "furious"]},
        },
    }
    body.update(extra)
    return body


def decide(stack: Stack, model: str) -> httpx.Response:
    """POST a System One decision for ``model`` with the stack's project key."""
    with stack.client() as client:
        return client.post("/v1/systemone", json=decision(model))


def public_models(stack: Stack) -> list[str]:
    """The model ids that GET /v1/models lists for the stack's project key."""
    with stack.client() as client:
        return [m["id"] for m in body(client.get("/v1/models"), 200)["data"]]


def wait_for(check: Any, timeout: float = 10.0, interval: float = 0.05) -> Any:
    """Poll ``check()`` until it returns something truthy (and return that); an exception counts
    as not yet. AssertionError with the last failure after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            value = check()
            if value:
                return value
            last = value
        except Exception as exc:  # noqa: BLE001 - not yet; reported if it never settles
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"not true after {timeout}s: {last!r}")
        time.sleep(interval)


T = TypeVar("T")


def add_service(db: Database, settings: Settings | None = None, **fields: Any) -> Service:
    """A service added as the CLI adds one (its backend read, its models registered), from sync code."""
    settings = settings or Settings(database_url=db.url)
    return run_async(services.add_service(db.in_session, settings, None, CLI, **fields, then=itself))


def run_async(walk: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on a thread of its own: the browser tests leave an event loop running on
    this one (Playwright's sync API), where ``asyncio.run`` refuses to start."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, walk).result()
