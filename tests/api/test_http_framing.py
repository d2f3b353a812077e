"""What the server itself answers, before any route: a header section over the cap, a request it
cannot parse. Raw sockets, since an HTTP client will not send such requests."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from typing import Any

import pytest

from app.server import MAX_HEAD_BYTES
from tests.support import Stack, assert_error, decision


def exchange(stack: Stack, raw: bytes, *, chunk: int = 16 * 1024) -> bytes:
    host, port = stack.gateway.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        try:
            for start in range(0, len(raw), chunk):
                sock.sendall(raw[start:start + chunk])
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server closed the connection before it had all of it: the answer is read below
        answer = b""
        while True:
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                break
            if not data:
                break
            answer += data
    return answer


def split(answer: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


def test_a_header_section_over_the_cap_is_431_and_the_connection_closes(stack: Stack) -> None:
    endless = b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (4 * MAX_HEAD_BYTES)
    status, headers, body = split(exchange(stack, endless))
    assert status == 431
    assert headers["connection"] == "close" and headers["content-type"] == "application/json"
    error = json.loads(body)
    assert error["detail"]["error_type"] == "request_too_large"
    assert str(MAX_HEAD_BYTES) in error["error"]
    with stack.client() as client:  # and the gateway goes on serving
        assert client.post("/v1/systemone", json=decision()).status_code == 200


@pytest.mark.parametrize("chunk", [1 << 20, 50_000], ids=["one write", "two writes"])
def test_a_whole_header_section_over_the_cap_is_431_however_it_arrives(stack: Stack, chunk: int) -> None:
    # A head that arrives complete in one or two reads is measured when it completes.
    body = json.dumps(decision()).encode()
    extra = b"".join(b"X-Pad-%d: %s\r\n" % (i, b"p" * 900) for i in range(110))  # ~100 KB
    raw = (b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + stack.project_key.encode()
           + b"\r\nContent-Type: application/json\r\n" + extra
           + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    status, headers, answer = split(exchange(stack, raw, chunk=chunk))
    assert status == 431 and headers["connection"] == "close", answer[:300]
    assert json.loads(answer)["detail"]["error_type"] == "request_too_large"
    with stack.client() as client:  # and the gateway goes on serving
        assert client.post("/v1/systemone", json=decision()).status_code == 200


def test_whitespace_in_a_header_section_counts_toward_the_cap(stack: Stack) -> None:
    # The parser drops the whitespace before a value: the cap counts the bytes that came.
    raw = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + b" " * (MAX_HEAD_BYTES + 1000) + b"v\r\n\r\n"
    status, headers, _ = split(exchange(stack, raw, chunk=len(raw)))
    assert status == 431 and headers["connection"] == "close"


def test_a_head_over_the_cap_after_a_pipelined_request_is_refused_after_its_answer(stack: Stack) -> None:
    """The client reads answers in order: the request before the refused one gets its own answer
    first (it was served and billed), then the 431."""
    body = json.dumps(decision()).encode()
    first = (b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + stack.project_key.encode()
             + b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    second = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (MAX_HEAD_BYTES + 6000) + b"\r\n\r\n"
    answer = exchange(stack, first + second, chunk=len(first + second))
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
    head, _, rest = answer.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length")))
    assert json.loads(rest[:length])["model"] == "nimble"
    status, headers, _ = split(rest[length:])
    assert status == 431 and headers["connection"] == "close"


def test_headers_under_the_cap_and_a_large_body_are_served(stack: Stack) -> None:
    # Many headers adding up to just under the cap, then a body in the same chunks: not a head over it.
    body = json.dumps(decision(state={"note": "x" * 60_000})).encode()
    extra = b"".join(b"X-Pad-%d: %s\r\n" % (i, b"p" * 900) for i in range((MAX_HEAD_BYTES - 2048) // 920))
    raw = (b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + stack.project_key.encode()
           + b"\r\nContent-Type: application/json\r\nConnection: close\r\n" + extra
           + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    status, _, answer = split(exchange(stack, raw, chunk=len(raw)))
    assert status == 200, answer[:300]
    assert json.loads(answer)["model"] == "nimble"


def test_a_request_the_server_cannot_parse_is_400_in_arbiters_shape(stack: Stack) -> None:
    raw = (b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Length: twelve\r\n\r\n{}")
    status, headers, body = split(exchange(stack, raw))
    assert status == 400 and headers["connection"] == "close"
    error = json.loads(body)
    assert error["detail"]["error_type"] == "invalid_request_error"
    assert error["error"].startswith("invalid HTTP request")


def read_all(sock: socket.socket) -> bytes:
    answer = b""
    while True:
        try:
            data = sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            break
        if not data:
            break
        answer += data
    return answer


@pytest.mark.parametrize("sent", [
    b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nX-Slow: a",  # a head that never ends
    (b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
     b"Content-Length: 500\r\n\r\n{\"model\": "),  # a body that never ends
])
def test_a_request_that_does_not_arrive_in_time_is_408_and_closed(gateway_factory: Any, db: Any,
                                                                   sent: bytes) -> None:
    stack = Stack.provision(db)
    stack.gateway = gateway = gateway_factory(client_timeout=1.5)
    host, port = gateway.url.removeprefix("http://").split(":")
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(sent.replace(b"Host: x\r\n", b"Host: x\r\nAuthorization: Bearer "
                                  + stack.project_key.encode() + b"\r\n"))
        for _ in range(3):  # a byte now and then does not keep it alive
            time.sleep(0.5)
            with contextlib.suppress(OSError):
                sock.sendall(b"a")
        answer = read_all(sock)
    waited = time.monotonic() - started
    status, headers, body = split(answer)
    assert status == 408 and headers["connection"] == "close"
    assert json.loads(body)["error"] == "the request did not arrive whole within 1.5s"
    assert 1.5 <= waited < 5
    with gateway.client(stack.project_key) as client:  # the gateway goes on serving
        assert client.get("/v1/models").status_code == 200


def _slow_request(stack: Stack, sent: bytes) -> tuple[int, dict[str, str], bytes]:
    host, port = stack.gateway.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(sent.replace(b"Host: x\r\n", b"Host: x\r\nAuthorization: Bearer "
                                  + stack.project_key.encode() + b"\r\n"))
        return split(read_all(sock))


def test_server_made_errors_on_v1_decisions_are_in_openais_shape_once_the_path_is_known(
        gateway_factory: Any, db: Any) -> None:
    stack = Stack.provision(db)
    stack.gateway = gateway_factory(client_timeout=1)
    # The head arrived, the body did not: 408 in OpenAI's shape, as every error of the endpoint.
    status, headers, body = _slow_request(stack, (
        b"POST /v1/decisions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100\r\n\r\n{\"model\""))
    assert status == 408 and headers["connection"] == "close"
    assert json.loads(body) == {"error": {"message": "the request did not arrive whole within 1s",
                                          "type": "invalid_request_error", "param": None, "code": None}}
    # A body the server cannot parse (a chunk size that is no number) after the head: 400, likewise.
    status, headers, body = split(exchange(stack, (
        b"POST /v1/decisions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + stack.project_key.encode()
        + b"\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n")))
    assert status == 400 and headers["connection"] == "close"
    error = json.loads(body)["error"]
    assert error["type"] == "invalid_request_error" and error["message"].startswith("invalid HTTP request")
    # Before the head is whole the endpoint is not known: Arbiter's shape (docs/api.md).
    status, _, body = _slow_request(stack, b"POST /v1/decisions HTTP/1.1\r\nHost: x\r\nX-Slow: a")
    assert status == 408 and json.loads(body)["detail"]["error_type"] == "invalid_request_error"
    status, _, body = split(exchange(stack, b"POST /v1/decisions HTTP/1.1\r\nHost: x\r\nX-Big: "
                                     + b"a" * (4 * MAX_HEAD_BYTES)))
    assert status == 431 and json.loads(body)["detail"]["error_type"] == "request_too_large"


def test_a_slow_client_within_the_time_is_served(db: Any, ollama: tuple[Any, Any],
                                                 gateway_factory: Any) -> None:  # the backend stops last
    server, _state = ollama
    stack = Stack.provision(db, ollama_url=server.url)
    gateway = gateway_factory(client_timeout=3)
    body = json.dumps(decision()).encode()
    raw = (b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + stack.project_key.encode()
           + b"\r\nContent-Type: application/json\r\nConnection: close\r\n"
           + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    host, port = gateway.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        for part in (raw[:40], raw[40:-10], raw[-10:]):  # in pieces over ~1 s
            sock.sendall(part)
            time.sleep(0.5)
        status, _, answer = split(read_all(sock))
    assert status == 200, answer[:300]


@pytest.mark.parametrize(("method", "path", "who"), [
    ("POST", "/v1/systemone/", "project"), ("POST", "/v1/chat/completions/", "project"),
    ("POST", "/api/chat/", "project"), ("POST", "/v1/decisions/", "project"), ("GET", "/v1/models/", "project"),
    ("GET", "/healthz/", None), ("GET", "/admin/projects/", "admin"), ("POST", "/admin/projects/", "admin"),
    ("GET", "/admin/services/", "admin"), ("GET", "/metrics/", None),
])
def test_an_api_path_with_a_trailing_slash_is_404_not_a_redirect(stack: Stack, method: str, path: str,
                                                                  who: str | None) -> None:
    """A redirect of a POST loses its body or its Authorization header in many clients: no 307."""
    with stack.client(who) as client:
        response = client.request(method, path, json=decision() if method == "POST" else None)
    assert "location" not in response.headers
    assert "no route" in assert_error(response, 404, "not_found_error")["error"]
