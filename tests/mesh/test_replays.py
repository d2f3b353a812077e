"""A signed mesh request is accepted once by a node: by every replica of it, after a restart,
and a credential signed for any node is good nowhere."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest
import redis
import redis.asyncio
from sqlalchemy import select

from app.db.models import MeshNonce
from app.db.session import Database
from app.mesh.auth import MeshAuth
from app.mesh.nonces import DatabaseNonces, RedisNonces
from tests.mesh.conftest import MESH_KEY, Node
from tests.support import Gateway, assert_error, closed_port, decision, redis_url, wait_for


def needs_redis() -> None:
    try:
        redis.Redis.from_url(redis_url(0), socket_timeout=1).ping()
    except redis.RedisError:
        pytest.skip("no Redis at 127.0.0.1:6379")


@pytest.mark.parametrize("store", ["database", "redis"])
def test_a_forwarded_request_is_accepted_once_by_every_replica_and_after_a_restart(
        mesh_node: Callable[..., Node], gateway_factory: Callable[..., Gateway], store: str) -> None:
    if store == "redis":
        needs_redis()
    shared: dict[str, Any] = {"redis_url": redis_url(0)} if store == "redis" else {}
    b = mesh_node("node-b", models={"tev1": ["decision"]}, **shared)
    # A second replica of node-b: same name, same database (and Redis, when there is one).
    replica = gateway_factory(mesh_key=MESH_KEY, mesh_node_name="node-b", **shared)
    wait_for(lambda: replica.app.components.registry.get("tev1") is not None)
    body = orjson.dumps(decision("tev1"))
    headers, _ = MeshAuth(MESH_KEY, "node-x").sign("POST", "/v1/systemone", body, target="node-b")
    first = httpx.post(f"{b.url}/v1/systemone", content=body, headers=headers)
    assert first.status_code == 200, first.text

    replayed = httpx.post(f"{replica.url}/v1/systemone", content=body, headers=headers)
    assert "replayed" in assert_error(replayed, 401, "authentication_error")["error"]

    b.gateway.stop()
    restarted = gateway_factory(mesh_key=MESH_KEY, mesh_node_name="node-b", **shared)
    wait_for(lambda: restarted.app.components.registry.get("tev1") is not None)
    replayed = httpx.post(f"{restarted.url}/v1/systemone", content=body, headers=headers)
    assert "replayed" in assert_error(replayed, 401, "authentication_error")["error"]


def test_a_node_whose_nonce_store_is_away_refuses_rather_than_risk_a_replay(
        mesh_node: Callable[..., Node]) -> None:
    b = mesh_node("node-b", models={"tev1": ["decision"]}, redis_url=f"redis://127.0.0.1:{closed_port()}/0")
    a = mesh_node("node-a", peers=[b.url])
    peer = wait_for(lambda: (p := a.mesh()["peers"][0])["state"] == "unreachable" and p)
    assert "HTTP 503" in peer["error"] and "nonce store is unreachable" in peer["error"]
    body = orjson.dumps(decision("tev1"))
    headers, _ = MeshAuth(MESH_KEY, "node-x").sign("POST", "/v1/systemone", body, target="node-b")
    refused = httpx.post(f"{b.url}/v1/systemone", content=body, headers=headers)
    assert "nonce store is unreachable" in assert_error(refused, 503, "backend_error")["error"]
    assert refused.headers["Retry-After"] == "1"


def test_a_credential_for_any_node_is_refused_and_an_introduction_records_nothing(
        mesh_node: Callable[..., Node]) -> None:
    c = mesh_node("node-c", models={"nimble": ["decision"]})
    # An exchange signed for any node (how v1 opened a link), as a capture replayed here would be:
    # refused at once, on its head.
    body = orjson.dumps({"protocol": 1, "node": "node-x", "url": "http://127.0.0.1:9", "version": "0.1.0",
                         "decision_models": True, "refused": None,
                         "models": [{"name": "planted", "type": "ollama", "capabilities": ["decision"],
                                     "path": ["node-x"]}]})
    headers, _ = MeshAuth(MESH_KEY, "node-x").sign("POST", "/mesh/v1/exchange", body, target="*")
    refused = httpx.post(f"{c.url}/mesh/v1/exchange", content=body, headers=headers)
    assert "any node (*) refused" in assert_error(refused, 401, "authentication_error")["error"]
    assert refused.headers["Connection"] == "close"
    # The introduction that opens a link now: its name, proved, and nothing recorded or shown.
    nonce = "ab" * 16
    hello = httpx.get(f"{c.url}/mesh/v1/hello", params={"nonce": nonce})
    assert hello.status_code == 200, hello.text
    assert hello.json() == {"protocol": 1, "node": "node-c"}
    assert MeshAuth(MESH_KEY, "node-x").answer_valid(nonce, hello.content, hello.headers.get("X-Arbiter-Mesh-Proof"),
                                                     introduction=True)
    assert_error(httpx.get(f"{c.url}/mesh/v1/hello", params={"nonce": "x"}), 400, "invalid_request_error")
    assert c.peer("node-x") is None
    assert_error(c.client().post("/v1/systemone", json=decision("planted")), 404, "not_found_error")


def test_the_database_store_refuses_a_nonce_twice_and_purges_expired_ones(db: Database) -> None:
    store = DatabaseNonces(db, lifetime=121)
    assert asyncio.run(store.first_use("a" * 32)) is True
    assert asyncio.run(store.first_use("a" * 32)) is False
    with db.session() as session:
        session.add(MeshNonce(nonce="b" * 32, expires_at=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)))
    asyncio.run(store.purge())
    with db.session() as session:
        assert list(session.scalars(select(MeshNonce.nonce))) == ["a" * 32]


def test_the_redis_store_refuses_a_nonce_twice_and_lets_redis_expire_it() -> None:
    needs_redis()
    url = redis_url(0)
    nonce = "c" * 32

    async def scenario() -> tuple[bool, bool]:
        client = redis.asyncio.from_url(url)
        try:
            await client.delete(f"arbiter:mesh-nonce:{nonce}")
            store = RedisNonces(client, lifetime=121)
            return await store.first_use(nonce), await store.first_use(nonce)
        finally:
            await client.aclose()

    assert asyncio.run(scenario()) == (True, False)
    assert 0 < redis.Redis.from_url(url).ttl(f"arbiter:mesh-nonce:{nonce}") <= 121
