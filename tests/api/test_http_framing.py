"""What the server itself answers, before any route: a header section over the cap, a request it
cannot parse. Raw sockets, since an HTTP client will not send such requests."""

from __future__ import annotations

import json
import socket

from app.server import MAX_HEAD_BYTES
from tests.support import Stack, decision


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
