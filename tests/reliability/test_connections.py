"""Connections that hold a descriptor without a request, and more connections than the cap: raw
sockets on loopback, against a real gateway with small timeouts and a cap of a few connections."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from app.openfiles import FIXED_DESCRIPTORS, HEALTH_RESERVE, connection_cap
from tests.support import Gateway, Stack, wait_for

HEALTH = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
SILENT = 3  # connections the tests hold open, sending nothing
WAIT = 10.0  # seconds a read may take before the test gives up: far past every timeout set here


def connect(gateway: Gateway, timeout: float = WAIT) -> socket.socket:
    host, port = gateway.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=timeout)


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a read timeout fails the test)."""
    answer = b""
    while True:
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            return answer
        if not data:
            return answer
        answer += data


def read_answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One answer with a Content-Length, leaving the connection as the server leaves it."""
    received = b""
    while b"\r\n\r\n" not in received:
        data = sock.recv(65536)
        assert data, f"closed before an answer: {received!r}"
        received += data
    head, _, body = received.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    while len(body) < int(headers["content-length"]):
        body += sock.recv(65536)
    return int(lines[0].split()[1]), headers, body


def open_connections(gateway: Gateway) -> float:
    return gateway.app.components.metrics.registry.get_sample_value("arbiter_connections_open") or 0.0


def counted(gateway: Gateway, name: str) -> float:
    return gateway.app.components.metrics.registry.get_sample_value(f"arbiter_connections_{name}_total") or 0.0


def idle(gateway: Gateway) -> int:
    """Connections the gateway counts idle (no byte since they opened or since their last answer)."""
    return len(getattr(gateway._server.server_state, "arbiter_idle", ()))


@contextlib.contextmanager
def held(gateway: Gateway, count: int, first: bytes = b"") -> Iterator[list[socket.socket]]:
    """``count`` connections open, one after the other, each having sent ``first`` and the gateway
    having read it (so that none is idle, and none closed to make room for the next)."""
    before = open_connections(gateway)
    socks: list[socket.socket] = []
    try:
        for opened in range(1, count + 1):
            socks.append(sock := connect(gateway))
            wait_for(lambda n=opened: open_connections(gateway) == before + n)
            if first:
                sock.sendall(first)
                wait_for(lambda: idle(gateway) == 0)
        yield socks
    finally:
        for sock in socks:
            sock.close()


def test_a_connection_that_sends_nothing_is_closed_after_the_client_timeout(gateway_factory: Any) -> None:
    gateway = gateway_factory(client_timeout=0.3)
    with connect(gateway) as sock:
        assert read_until_closed(sock) == b""  # closed, and nothing to answer: no request came
    wait_for(lambda: open_connections(gateway) == 0)
    with connect(gateway) as sock:  # and a client that does send is served
        sock.sendall(HEALTH)
        assert read_answer(sock)[0] == 200


def test_an_idle_keep_alive_connection_is_closed_after_its_timeout(gateway_factory: Any) -> None:
    gateway = gateway_factory(keep_alive_timeout=0.2)
    # uvicorn's own default is 5 s: a read that gives up well before then tells them apart.
    with connect(gateway, timeout=4) as sock:
        sock.sendall(HEALTH)
        status, headers, _ = read_answer(sock)
        assert status == 200 and headers.get("connection") != "close"
        assert read_until_closed(sock) == b""


def test_past_the_cap_an_idle_connection_makes_room_for_a_new_one(gateway_factory: Any, db: Any) -> None:
    """A flood of connections that send nothing cannot keep out a client that sends: the one idle
    the longest is closed (nothing in progress on it is lost)."""
    stack = Stack.provision(db)
    gateway = gateway_factory(max_connections=SILENT)
    with held(gateway, SILENT) as silent:
        with connect(gateway) as sock:
            sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                         + stack.project_key.encode() + b"\r\n\r\n")
            assert read_answer(sock)[0] == 200
        assert read_until_closed(silent[0]) == b""  # the oldest went, unanswered
    assert counted(gateway, "idle_closed") == 1 and counted(gateway, "refused") == 0


def test_past_the_cap_a_new_connection_gets_503_and_health_checks_are_answered(gateway_factory: Any,
                                                                              db: Any) -> None:
    stack = Stack.provision(db)
    gateway = gateway_factory(max_connections=SILENT)
    # Connections busy with a request (its head is not whole yet): none is idle, none can go.
    with held(gateway, SILENT, first=b"GET /v1/models HTTP/1.1\r\n"):
        with connect(gateway) as sock:
            sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            status, headers, body = read_answer(sock)
            assert read_until_closed(sock) == b""
        assert status == 503 and headers["retry-after"] == "1" and headers["connection"] == "close"
        error = json.loads(body)
        assert error == {"error": f"Arbiter is at its limit of {SILENT} open connections; try again shortly",
                         "detail": {"error_type": "backend_error", "message": error["error"]}}
        for path in (b"/healthz", b"/readyz?probe=1"):  # health checks are still answered, then closed
            with connect(gateway) as sock:
                sock.sendall(b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n")
                status, headers, _ = read_answer(sock)
                assert status == 200 and headers["connection"] == "close"
                assert read_until_closed(sock) == b""
        assert counted(gateway, "refused") == 1
        wait_for(lambda: open_connections(gateway) == SILENT)
        # Past the reserve kept for health checks, a connection is refused at once, before it sends.
        with held(gateway, HEALTH_RESERVE, first=b"GET /healthz"), connect(gateway) as sock:
            status, headers, _ = read_answer(sock)
            assert status == 503 and headers["retry-after"] == "1"
            assert read_until_closed(sock) == b""
        assert counted(gateway, "refused") == 2
    wait_for(lambda: open_connections(gateway) == 0)
    with gateway.client(stack.admin_key) as client:  # below the cap again: served, and counted in /metrics
        metrics = client.get("/metrics").text
    assert "arbiter_connections_refused_total 2.0" in metrics
    assert "arbiter_connections_open 1.0" in metrics  # the scrape's own


def test_the_default_cap_fits_under_the_open_file_limit() -> None:
    for limit in (1024, 4096, 65536, 1 << 20):
        cap = connection_cap(None, limit)
        assert 0 < cap and 2 * cap + HEALTH_RESERVE + FIXED_DESCRIPTORS <= limit
    assert connection_cap(None, 1024) > 300  # a small limit still serves a few hundred clients
    assert connection_cap(50, 1024) == 50


@pytest.mark.skipif(os.name != "posix", reason="RLIMIT_NOFILE is POSIX")
def test_the_open_file_limit_is_raised_to_the_hard_limit() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard <= 512:
        pytest.skip(f"the hard limit here ({hard}) leaves nothing to raise")

    def lowered() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (512, hard))

    done = subprocess.run([sys.executable, "-c", "from app.openfiles import raise_open_file_limit as r; print(r())"],
                          preexec_fn=lowered, capture_output=True, text=True, check=True, timeout=60)
    assert int(done.stdout) == hard
