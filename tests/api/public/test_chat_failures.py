"""Chat when something goes wrong (SPEC §1, §4): a client that hangs up, a backend that stalls
or breaks mid-answer, replicas that fail. Over real HTTP, against a backend that notes what
it saw of Arbiter's connection."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from aiohttp import web

from app.db.session import Database
from infra_adapters.emulators.ollama import OllamaState, make_ollama_app
from infra_adapters.emulators.server import EmulatorServer
from tests.support import Gateway, Stack, add_service, assert_error, decision, wait_for

MODEL = "talk"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


class SlowChat:
    """An Ollama that serves one chat model, slowly: ``head_delay`` before its answer's head, then
    ``lines`` NDJSON lines (SSE events on /v1/chat/completions) ``delay`` apart, or with
    ``"stream": false`` a JSON answer that stalls ``delay`` seconds halfway. It notes how many
    pieces it wrote and whether Arbiter closed the connection before it was done."""

    def __init__(self, *, lines: int = 40, delay: float = 0.1, head_delay: float = 0.0) -> None:
        self.lines, self.delay, self.head_delay = lines, delay, head_delay
        self.written = 0
        self.hung_up: float | None = None  # when it saw Arbiter's connection close
        self.finished = False

    def app(self) -> web.Application:
        async def version(_: web.Request) -> web.Response:
            return web.json_response({"version": "0.35.0"})

        async def tags(_: web.Request) -> web.Response:
            return web.json_response({"models": [{"name": f"{MODEL}:latest", "model": f"{MODEL}:latest",
                                                  "details": {}}]})

        async def show(_: web.Request) -> web.Response:
            return web.json_response({"capabilities": ["completion"]})

        app = web.Application()
        app.router.add_get("/api/version", version)
        app.router.add_get("/api/tags", tags)
        app.router.add_post("/api/show", show)
        app.router.add_post("/api/chat", self._chat)
        app.router.add_post("/v1/chat/completions", self._chat)
        return app

    def _gone(self, request: web.Request) -> bool:
        transport = request.transport
        if transport is None or transport.is_closing():
            self.hung_up = self.hung_up or time.monotonic()
            return True
        return False

    async def _pause(self, request: web.Request, seconds: float) -> bool:
        """Sleep, watching the connection; False when Arbiter hung up meanwhile."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self._gone(request):
                return False
            await asyncio.sleep(0.01)
        return not self._gone(request)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._answer(request)
        except (ConnectionError, asyncio.CancelledError):  # aiohttp cancels a handler whose client left
            self.hung_up = self.hung_up or time.monotonic()
            raise

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        streamed = (await request.json()).get("stream", request.path == "/api/chat")
        if not await self._pause(request, self.head_delay):
            return web.Response()
        response = web.StreamResponse()
        response.content_type = "application/x-ndjson" if streamed else "application/json"
        if request.path == "/v1/chat/completions" and streamed:
            response.content_type = "text/event-stream"
        await response.prepare(request)
        if not streamed:
            await response.write(b'{"model":"talk:latest",')
            self.written += 1
            if not await self._pause(request, self.delay):
                return response
            await response.write(b'"done":true}')
        else:
            for index in range(self.lines):
                line = b'{"model":"talk:latest","n":%d,"done":false}\n' % index
                await response.write(b"data: " + line + b"\n" if request.path.startswith("/v1") else line)
                self.written += 1
                if not await self._pause(request, self.delay):
                    return response
        await response.write_eof()
        self.finished = True
        return response


@pytest.fixture
def slow(db: Database, gateway_factory: Callable[..., Gateway]) -> Iterator[tuple[Stack, SlowChat]]:
    backend = SlowChat()
    with EmulatorServer(backend.app()) as server:
        stack = Stack.provision(db, ollama_url=server.url)
        stack.gateway = gateway_factory(max_concurrency=1)
        yield stack, backend


def in_flight(stack: Stack) -> int:
    return sum(r.in_flight for e in stack.gateway.app.components.registry.entries() for r in e.replicas)


def recorded_status(stack: Stack) -> int:
    """The status the usage record of the latest chat request holds (once it is written)."""
    with stack.client("admin") as admin:
        chats = [r for r in admin.get("/admin/usage/recent").json()["data"] if r["operation"] == "chat"]
    return int(chats[0]["status"]) if chats else 0


@pytest.mark.parametrize("path", ["/api/chat", "/v1/chat/completions"])
def test_a_client_that_hangs_up_mid_stream_stops_the_backend(slow: tuple[Stack, SlowChat], path: str) -> None:
    stack, backend = slow
    with stack.client() as client:
        with client.stream("POST", path, json={**CHAT, "stream": True}) as response:
            assert response.status_code == 200
            assert b'"n":0' in next(response.iter_raw())
        left = time.monotonic()  # the response is closed unread: httpx drops the connection
        wait_for(lambda: backend.hung_up, timeout=3)
        assert backend.hung_up is not None and backend.hung_up - left < 1.0
        assert not backend.finished and backend.written < backend.lines
        wait_for(lambda: in_flight(stack) == 0, timeout=2)
        assert wait_for(lambda: recorded_status(stack)) == 200  # the answer had begun
        # The concurrency cap (1 here) has its slot back: the next request is served, not shed.
        backend.lines, backend.delay = 2, 0.0
        assert client.post(path, json={**CHAT, "stream": True}).status_code == 200


@pytest.mark.parametrize("waiting_for", ["the head", "the whole answer"])
def test_a_client_that_hangs_up_while_arbiter_waits_frees_the_backend(slow: tuple[Stack, SlowChat],
                                                                       waiting_for: str) -> None:
    stack, backend = slow
    if waiting_for == "the head":
        backend.head_delay = 5.0
    else:
        backend.delay = 5.0  # the JSON answer stalls halfway
    with stack.client() as client, pytest.raises(httpx.ReadTimeout):
        client.post("/v1/chat/completions", json={**CHAT, "stream": False}, timeout=0.5)
    left = time.monotonic()
    wait_for(lambda: backend.hung_up, timeout=3)
    assert backend.hung_up is not None and backend.hung_up - left < 1.0
    assert not backend.finished
    wait_for(lambda: in_flight(stack) == 0, timeout=2)
    assert wait_for(lambda: recorded_status(stack)) == 499  # nothing was sent: "client closed request"


# -- a backend that fails mid-answer ------------------------------------------------------------


def chat(stream: bool) -> dict[str, Any]:
    return {"model": "llama3.2", "messages": [{"role": "user", "content": "hello there, my friend"}],
            "stream": stream}


def backed_off(stack: Stack, body: dict[str, Any] | None = None) -> bool:
    """The one replica is out: the next request is Arbiter's 503 with Retry-After (SPEC §4)."""
    with stack.client() as client:
        response = client.post("/v1/chat/completions", json=body or chat(False))
    if response.status_code == 200:
        return False
    assert "down or backed off" in assert_error(response, 503)["error"] and response.headers["retry-after"]
    return True


def test_a_backend_that_stalls_mid_answer_is_504_and_backed_off(db: Database,
                                                                  gateway_factory: Callable[..., Gateway]) -> None:
    backend = SlowChat(delay=3.0)
    with EmulatorServer(backend.app()) as server:
        stack = Stack.provision(db, ollama_url=server.url)
        stack.gateway = gateway_factory(backend_timeout=0.5, replica_backoff=30)
        with stack.client() as client:
            started = time.monotonic()
            response = client.post("/v1/chat/completions", json={**CHAT, "stream": False})
        assert time.monotonic() - started < 2.0
        assert "did not answer within 0.5s" in assert_error(response, 504)["error"]
        assert backed_off(stack, {**CHAT, "stream": False})


def test_a_broken_answer_is_502_and_backed_off(stack: Stack, gateway_factory: Callable[..., Gateway]) -> None:
    stack.gateway = gateway_factory(replica_backoff=30)
    stack.ollama_state.faults.reset_mid_body = True
    with stack.client() as client:
        response = client.post("/v1/chat/completions", json=chat(False))
    assert "broke the connection" in assert_error(response, 502)["error"]
    stack.ollama_state.faults.reset()
    assert backed_off(stack)


@pytest.mark.parametrize("fault", ["reset_mid_body", "silence"])
def test_a_stream_that_breaks_ends_unfinished_and_backs_the_replica_off(
        stack: Stack, gateway_factory: Callable[..., Gateway], fault: str) -> None:
    stack.gateway = gateway_factory(replica_backoff=30, backend_timeout=0.5)
    if fault == "reset_mid_body":
        stack.ollama_state.faults.reset_mid_body = True
    else:
        stack.ollama_state.stream_delay = 2.0  # a silence longer than the timeout between chunks
    got = b""
    with stack.client() as client, client.stream("POST", "/api/chat", json=chat(True)) as response:
        assert response.status_code == 200
        with pytest.raises(httpx.RemoteProtocolError):  # no final chunk: a broken stream, not a whole one
            for chunk in response.iter_raw():
                got += chunk
    assert got and b'"done":true' not in got
    stack.ollama_state.faults.reset()
    stack.ollama_state.stream_delay = 0.0
    assert backed_off(stack)


def test_an_answer_over_the_response_cap_is_502_and_the_replica_stays_in(
        stack: Stack, gateway_factory: Callable[..., Gateway]) -> None:
    stack.gateway = gateway_factory(max_response_bytes=64 * 1024, replica_backoff=30)
    stack.ollama_state.faults.huge_body_bytes = 1024 * 1024
    with stack.client() as client:
        response = client.post("/v1/chat/completions", json=chat(False))
    assert "65536-byte response cap" in assert_error(response, 502)["error"]
    stack.ollama_state.faults.reset()
    assert not backed_off(stack)  # the answer was too big, the replica is fine


# -- several replicas ----------------------------------------------------------------------------


@pytest.fixture
def three(stack: Stack) -> Iterator[tuple[Stack, list[OllamaState]]]:
    """Three Ollamas serving the same models, each answering its own 503."""
    states = [stack.ollama_state, OllamaState(), OllamaState()]
    servers = [EmulatorServer(make_ollama_app(state)).start() for state in states[1:]]
    try:
        for index, server in enumerate(servers, start=1):
            add_service(stack.db, type="ollama-external", url=server.url, name=f"ollama-{index}")
        wait_for(lambda: {len(e.replicas) for e in stack.gateway.app.components.registry.entries()} == {3})
        for index, state in enumerate(states):
            state.faults.status, state.faults.body = 503, b'{"error":"replica %d is overloaded"}' % index
        yield stack, states
    finally:
        for server in servers:
            server.stop()


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/chat", "/v1/systemone"])
def test_the_last_replicas_own_503_passes_through(three: tuple[Stack, list[OllamaState]], path: str) -> None:
    stack, states = three
    body = decision() if path == "/v1/systemone" else chat(False)
    with stack.client() as client:
        response = client.post(path, json=body)
    assert response.status_code == 503, response.text
    assert b"is overloaded" in response.content  # the backend's own answer, not Arbiter's
    assert sorted(state.faults.applied for state in states) == [0, 1, 1]  # tried once, retried once


@pytest.fixture
def two(stack: Stack, gateway_factory: Callable[..., Gateway]) -> Iterator[tuple[Stack, list[OllamaState]]]:
    """Two Ollamas serving the same models."""
    states = [stack.ollama_state, OllamaState()]
    server = EmulatorServer(make_ollama_app(states[1])).start()
    try:
        add_service(stack.db, type="ollama-external", url=server.url, name="ollama-1")
        stack.gateway = gateway_factory(replica_backoff=30)
        wait_for(lambda: {len(e.replicas) for e in stack.gateway.app.components.registry.entries()} == {2})
        yield stack, states
    finally:
        server.stop()


# Which replica answers 503: tried first in one case, second in the other.
@pytest.mark.parametrize("overloaded", [0, 1])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/chat", "/v1/systemone"])
def test_a_replicas_own_503_beats_the_other_replicas_connection_error(
        two: tuple[Stack, list[OllamaState]], path: str, overloaded: int) -> None:
    """The 503 is the only answer any backend gave: it comes back byte for byte, on every route,
    whichever replica was tried first; not Arbiter's 502 for the other one's dropped connection."""
    stack, states = two
    states[overloaded].faults.status = 503
    states[overloaded].faults.body = b'{"error":"overloaded, try later"}'
    states[overloaded].faults.headers = {"Retry-After": "7"}
    states[1 - overloaded].faults.drop_connection = True
    body = decision() if path == "/v1/systemone" else chat(path == "/api/chat")
    with stack.client() as client:
        response = client.post(path, json=body)
    assert [state.faults.applied for state in states] == [1, 1]  # tried once, retried once
    assert response.status_code == 503, response.text
    assert response.content == b'{"error":"overloaded, try later"}'
    assert response.headers["content-type"].startswith("application/json")
    assert response.headers["retry-after"] == "7"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/chat", "/v1/systemone"])
def test_a_replica_that_rejects_arbiters_key_is_passed_over_for_the_other(
        stack: Stack, gateway_factory: Callable[..., Gateway], path: str, caplog: pytest.LogCaptureFixture) -> None:
    """A service whose key was rotated elsewhere refuses Arbiter's credential: about that service,
    not the request, so another replica answers it, on every route (not a 500 for a coin toss),
    and the operator is told in the log on every route too (chat said nothing once)."""
    guarded = OllamaState()  # no key wanted while the service is added and synced
    server = EmulatorServer(make_ollama_app(guarded)).start()
    try:
        add_service(stack.db, type="ollama-external", url=server.url, name="guarded", credential="the-old-key")
        stack.gateway = gateway_factory()
        wait_for(lambda: {len(e.replicas) for e in stack.gateway.app.components.registry.entries()} == {2})
        guarded.required_bearer = "rotated-elsewhere"
        body = decision() if path == "/v1/systemone" else chat(False)
        with stack.client() as client:
            codes = [client.post(path, json=body).status_code for _ in range(4)]
        assert codes == [200] * 4
        assert any(r.path != "/api/version" and r.method == "POST" for r in guarded.requests)  # it was tried
        refusals = [r for r in caplog.records if r.name == "arbiter.forwarding"]
        assert refusals and refusals[0].getMessage() == "service guarded rejected Arbiter's credential (HTTP 401)"
    finally:
        server.stop()
