"""What admins and peers send that a node takes calmly: credentials in peer URLs are refused or
dropped, never shown; a peer that goes away in the middle of its model list is no error."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Iterator

import httpx
import orjson
import pytest

from app.mesh.auth import MeshAuth
from app.mesh.protocol import EXCHANGE_PATH
from tests.mesh.conftest import MESH_KEY, Node
from tests.support import assert_error, wait_for


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def server_logs() -> Iterator[_Records]:
    """Arbiter's log records and uvicorn's (which does not pass its own on to the root logger)."""
    records = _Records()
    loggers = [logging.getLogger(name) for name in ("arbiter", "uvicorn.error")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(records)
        logger.setLevel(logging.INFO)
    yield records
    for logger, level in zip(loggers, levels, strict=True):
        logger.removeHandler(records)
        logger.setLevel(level)


def test_a_peer_url_with_a_user_or_password_is_refused_and_never_shown(mesh_node: Callable[..., Node]) -> None:
    a = mesh_node("node-a")
    for url in ("http://admin:s3cret@node-b:8080", "https://s3cret@node-b", "http://admin:s3cret@[::1"):
        refused = a.admin().post("/admin/mesh/peers", json={"url": url})
        assert "user or password" in assert_error(refused, 400, "invalid_request_error")["error"]
        assert "s3cret" not in refused.text
    assert "s3cret" not in a.admin().get("/admin/mesh").text


def test_a_url_with_a_user_or_password_that_a_peer_announces_is_not_kept(mesh_node: Callable[..., Node]) -> None:
    a = mesh_node("node-a")
    body = orjson.dumps({"protocol": 1, "node": "node-x", "url": "http://admin:s3cret@127.0.0.1:9",
                         "version": "0.1.0", "decision_models": True, "models": []})
    headers, _ = MeshAuth(MESH_KEY, "node-x").sign("POST", EXCHANGE_PATH, body, target="node-a")
    answer = httpx.post(a.url + EXCHANGE_PATH, content=body, headers=headers)
    assert answer.status_code == 200, answer.text
    peer = a.peer("node-x")
    assert peer is not None and peer["url"] is None
    assert "s3cret" not in a.admin().get("/admin/mesh").text


def test_a_peer_that_goes_away_in_the_middle_of_its_list_is_no_error(
        mesh_node: Callable[..., Node], server_logs: _Records) -> None:
    b = mesh_node("node-b")
    body = orjson.dumps({"protocol": 1, "node": "node-x", "url": None, "version": "0.1.0",
                         "decision_models": True, "models": []})
    # Signed for the length it declares: the credential holds, and the node reads the list.
    padded = body + b" " * 100
    headers, _ = MeshAuth(MESH_KEY, "node-x").sign("POST", EXCHANGE_PATH, padded, target="node-b")
    signed = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    with socket.create_connection(("127.0.0.1", b.gateway.port)) as sock:
        sock.sendall(f"POST {EXCHANGE_PATH} HTTP/1.1\r\nHost: node-b\r\nContent-Type: application/json\r\n"
                     f"{signed}Content-Length: {len(padded)}\r\n\r\n".encode() + body[:10])
        time.sleep(0.3)  # the node is reading the list when the peer goes
    wait_for(lambda: any("went away in the middle of its model list" in r.getMessage()
                         for r in server_logs.records))
    assert [r.getMessage() for r in server_logs.records if r.levelno >= logging.ERROR] == []
    assert b.mesh()["peers"] == []
