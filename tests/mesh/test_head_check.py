"""A mesh credential is proved on the request's head, before a byte of its body is read: a forged
one is refused at once (and the connection closed), whatever body it declares; the body, once
read, must be the one the credential signed, or nothing is done with it."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest
from aiohttp import web

from app.api.asgi import Message
from app.api.public.intake import take
from app.mesh.auth import DIGEST_HEADER, MeshAuth
from app.mesh.protocol import EXCHANGE_PATH
from infra_adapters.emulators.server import EmulatorServer
from tests.mesh.conftest import MESH_KEY, Node
from tests.mesh.old_peer import MemoryNonces
from tests.support import assert_error, decision, wait_for

DECLARED = 32 * 1024 * 1024  # the body cap: a credential is checked before a length is
SENT = 1024  # of the declared body, before the answer is awaited


def _head(path: str, headers: dict[str, str], length: int) -> bytes:
    lines = "".join(f"{name}: {value}\r\n" for name, value in headers.items() if name != "Content-Length")
    return (f"POST {path} HTTP/1.1\r\nHost: node-b\r\nContent-Type: application/json\r\n{lines}"
            f"Content-Length: {length}\r\n\r\n").encode("latin-1")


def _answer_to_a_partial_upload(port: int, path: str, headers: dict[str, str]) -> tuple[bytes, bool]:
    """Send the head and SENT bytes of a DECLARED-byte body, then read without sending more:
    ``(the answer, whether the node closed the connection after it)``. A node that waited for
    the rest of the body would never answer (the timeout only keeps a broken run from hanging)."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(30)
        sock.sendall(_head(path, headers, DECLARED) + b"{" + b" " * (SENT - 1))
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except TimeoutError:
            return answer, False
        except ConnectionResetError:  # closed while our unsent declared body was still owed
            pass
    return answer, True


def _forged(kind: str, path: str, target: str = "node-b") -> dict[str, str]:
    body = b"{" + b" " * (DECLARED - 1)
    if kind == "another key":
        return MeshAuth("not the mesh key", "node-x").sign("POST", path, body, target=target)[0]
    headers = MeshAuth(MESH_KEY, "node-x").sign("POST", path, body, target=kind if kind in ("*", "node-c")
                                                 else target)[0]
    fields = headers["Authorization"].split(";")
    if kind == "stale":
        fields[3] = str(int(fields[3]) - 600)
    elif kind == "v1":
        fields[0] = "ArbiterMesh v1"
    elif kind == "forged signature":
        fields[7] = "0" * 64
    return {**headers, "Authorization": ";".join(fields)}


@pytest.mark.parametrize("path", ["/v1/systemone", EXCHANGE_PATH])
@pytest.mark.parametrize("kind", ["forged signature", "another key", "stale", "*", "node-c", "v1"])
def test_a_forged_claim_is_refused_before_its_body_is_read(mesh_node: Callable[..., Node], path: str,
                                                            kind: str) -> None:
    b = mesh_node("node-b", models={"tev1": ["decision"]})
    answer, closed = _answer_to_a_partial_upload(b.gateway.port, path, _forged(kind, path))
    head = answer.split(b"\r\n\r\n", 1)[0].lower()
    assert head.startswith(b"http/1.1 401"), answer[:300]
    assert b"\r\nconnection: close" in head and b"x-arbiter-mesh-refused: 1" in head
    assert closed  # and the rest of the 32 MiB was never waited for
    assert all(r.path != "/v1/systemone" for r in b.ollama.requests)


def test_a_replayed_claim_is_refused_before_its_body_is_read(mesh_node: Callable[..., Node]) -> None:
    b = mesh_node("node-b", models={"tev1": ["decision"]})
    body = b"{" + b" " * (DECLARED - 1)
    headers, _ = MeshAuth(MESH_KEY, "node-x").sign("POST", "/v1/systemone", body, target="node-b")
    with socket.create_connection(("127.0.0.1", b.gateway.port)) as sock:  # once, whole: a 400 (not JSON)
        sock.settimeout(30)
        sock.sendall(_head("/v1/systemone", headers, DECLARED) + body)
        assert sock.recv(65536).startswith(b"HTTP/1.1 400")
    answer, closed = _answer_to_a_partial_upload(b.gateway.port, "/v1/systemone", headers)
    assert answer.startswith(b"HTTP/1.1 401") and b"replayed" in answer and closed


def test_a_body_that_is_not_the_signed_one_is_refused_and_not_forwarded(mesh_node: Callable[..., Node]) -> None:
    b = mesh_node("node-b", models={"tev1": ["decision"]})
    signed_body = orjson.dumps(decision("tev1"))
    other_body = signed_body.replace(b"charged twice", b"charged once!")  # the same length
    auth = MeshAuth(MESH_KEY, "node-x")
    headers, _ = auth.sign("POST", "/v1/systemone", signed_body, target="node-b")
    refused = b.gateway.client().post("/v1/systemone", content=other_body, headers=headers)
    assert "not the one that was signed" in assert_error(refused, 401, "authentication_error")["error"]
    assert refused.headers["X-Arbiter-Mesh-Refused"] == "1"
    assert [r for r in b.ollama.requests if r.path == "/v1/systemone"] == []
    # The signed body itself goes through (so the check above could have seen a forward).
    headers, _ = auth.sign("POST", "/v1/systemone", signed_body, target="node-b")
    assert b.gateway.client().post("/v1/systemone", content=signed_body, headers=headers).status_code == 200
    assert len([r for r in b.ollama.requests if r.path == "/v1/systemone"]) == 1


def test_a_model_list_that_is_not_the_signed_one_is_refused_and_not_learned(mesh_node: Callable[..., Node]) -> None:
    b = mesh_node("node-b")
    signed_body = orjson.dumps({"protocol": 1, "node": "node-x", "url": "http://127.0.0.1:9", "version": "0.1.0",
                                "decision_models": True, "refused": None,
                                "models": [{"name": "planted", "type": "ollama", "capabilities": ["completion"],
                                            "path": ["node-x"]}]})
    headers, _ = MeshAuth(MESH_KEY, "node-x").sign("POST", EXCHANGE_PATH, signed_body, target="node-b")
    refused = b.gateway.client().post(EXCHANGE_PATH, content=signed_body.replace(b"planted", b"plantex"),
                                      headers=headers)
    assert "not the one that was signed" in assert_error(refused, 401, "authentication_error")["error"]
    assert b.peer("node-x") is None
    assert "not the one that was signed" in b.mesh()["refused"][-1]["reason"]


def test_a_signed_request_without_its_digest_or_length_is_refused(mesh_node: Callable[..., Node]) -> None:
    b = mesh_node("node-b", models={"tev1": ["decision"]})
    body = orjson.dumps(decision("tev1"))
    headers, _ = MeshAuth(MESH_KEY, "node-x").sign("POST", "/v1/systemone", body, target="node-b")
    without_digest = {k: v for k, v in headers.items() if k != DIGEST_HEADER}
    refused = b.gateway.client().post("/v1/systemone", content=body, headers=without_digest)
    assert DIGEST_HEADER in assert_error(refused, 401, "authentication_error")["error"]
    chunked = b.gateway.client().post("/v1/systemone", content=iter([body]), headers=headers)  # no length
    assert "Content-Length" in assert_error(chunked, 401, "authentication_error")["error"]


def test_a_v1_peer_is_named_in_the_refusals(mesh_node: Callable[..., Node]) -> None:
    b = mesh_node("node-b")
    answer, _ = _answer_to_a_partial_upload(b.gateway.port, EXCHANGE_PATH, _forged("v1", EXCHANGE_PATH))
    assert answer.startswith(b"HTTP/1.1 401")
    refusal = b.mesh()["refused"][-1]
    assert refusal["peer"] == "node-x" and "v1 refused" in refusal["reason"] and "upgraded" in refusal["reason"]


@pytest.fixture
def v1_peer() -> Iterator[EmulatorServer]:
    """A node of an earlier build: no introduction route, and every v2 credential is malformed to it."""
    async def exchange(_request: web.Request) -> web.Response:
        return web.json_response({"error": "malformed mesh credential"}, status=401)

    app = web.Application()
    app.router.add_post(EXCHANGE_PATH, exchange)
    with EmulatorServer(app) as server:
        yield server


def test_a_peer_of_an_earlier_build_shows_as_incompatible(mesh_node: Callable[..., Node],
                                                          v1_peer: EmulatorServer) -> None:
    a = mesh_node("node-a", peers=[v1_peer.url])
    peer = wait_for(lambda: (p := a.mesh()["peers"][0])["state"] == "incompatible" and p)
    assert "earlier Arbiter" in peer["error"] and "upgrade it" in peer["error"]


def test_the_node_never_receives_the_body_of_a_forged_claim() -> None:
    """The hot path's intake, with a receive() that records every call: none is made."""
    auth = MeshAuth(MESH_KEY, "node-b", MemoryNonces())
    forged = _forged("forged signature", "/v1/systemone")
    scope: dict[str, Any] = {"type": "http", "method": "POST", "path": "/v1/systemone", "query_string": b"",
                             "state": {"request_id": "r1"},
                             "headers": [(k.lower().encode(), v.encode()) for k, v in
                                         {**forged, "Content-Length": str(DECLARED)}.items()]}
    received: list[Message] = []
    sent: list[Message] = []

    async def receive() -> Message:
        received.append({})
        return {"type": "http.request", "body": b"{}", "more_body": True}

    async def send(message: Message) -> None:
        sent.append(message)

    assert asyncio.run(take(scope, receive, send, None, DECLARED, mesh=auth)) is None  # type: ignore[arg-type]
    assert received == []
    assert sent[0]["status"] == 401 and (b"connection", b"close") in sent[0]["headers"]
