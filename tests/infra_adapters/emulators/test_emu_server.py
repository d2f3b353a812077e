"""EmulatorServer: start, stop, restart on the same port, stop with open connections."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest

from infra_adapters.emulators.ollama import OllamaState, make_ollama_app
from infra_adapters.emulators.server import EmulatorServer
from infra_adapters.emulators.vllm import VllmState, make_vllm_app

BODY = {"model": "nimble", "state": "s", "questions": {"q": {"type": "noul"}}}


def test_restart_on_the_same_port() -> None:
    state = OllamaState()
    server = EmulatorServer(make_ollama_app(state)).start()
    try:
        port, url = server.port, server.url
        assert port > 0 and url == f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=url, timeout=2.0) as client:
            first = client.post("/v1/systemone", json=BODY).json()
            server.stop()
            assert not server.running
            with pytest.raises(httpx.ConnectError):
                client.get("/api/version")
            server.start()
            assert server.port == port
            assert client.post("/v1/systemone", json=BODY).json() == first
            server.stop()
            server.start()
            assert client.get("/api/version").status_code == 200
    finally:
        server.stop()
    server.stop()  # stopping twice is harmless


def test_explicit_port_and_context_manager() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        free = sock.getsockname()[1]
    with EmulatorServer(make_vllm_app(VllmState()), port=free) as server:
        assert server.port == free
        assert httpx.get(f"{server.url}/version", timeout=2.0).json() == {"version": "0.11.0"}
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{free}/version", timeout=2.0)


def test_port_in_use_raises() -> None:
    with EmulatorServer(make_vllm_app(VllmState())) as server:
        clash = EmulatorServer(make_vllm_app(VllmState()), port=server.port)
        with pytest.raises(OSError):
            clash.start()
        assert not clash.running


def test_stop_closes_hanging_connections() -> None:
    state = OllamaState()
    state.faults.hang = True
    server = EmulatorServer(make_ollama_app(state)).start()
    errors: list[BaseException] = []

    def call() -> None:
        try:
            httpx.post(f"{server.url}/v1/systemone", json=BODY, timeout=10.0)
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            errors.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    deadline = time.monotonic() + 10.0
    while state.faults.applied == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert state.faults.applied == 1  # the request is in flight, hanging
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 2.0
    thread.join(3.0)
    assert not thread.is_alive()
    assert errors and isinstance(errors[0], httpx.RemoteProtocolError | httpx.ReadError)


def test_two_servers_side_by_side() -> None:
    a, b = OllamaState(version="0.35.0"), OllamaState(version="0.6.5")
    with EmulatorServer(make_ollama_app(a)) as sa, EmulatorServer(make_ollama_app(b)) as sb:
        assert sa.port != sb.port
        assert httpx.post(f"{sa.url}/v1/systemone", json=BODY, timeout=2).status_code == 200
        assert httpx.post(f"{sb.url}/v1/systemone", json=BODY, timeout=2).status_code == 404
    assert len(a.requests) == len(b.requests) == 1
