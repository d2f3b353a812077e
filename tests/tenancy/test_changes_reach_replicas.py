"""Two gateways on one database and one Redis: a key change made through one is refused by the
other at once, through the change bus, not at its key cache's expiry (an hour here)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import httpx
import pytest
import redis

from tests.support import Gateway, Stack, body, decision, redis_url, synced, wait_for

REDIS = redis_url(0)


@pytest.fixture
def pair(stack: Stack, gateway_factory: Callable[..., Gateway]) -> tuple[Gateway, Gateway]:
    try:
        redis.Redis.from_url(REDIS, socket_timeout=1).ping()
    except redis.RedisError:
        pytest.skip("no Redis at 127.0.0.1:6379")
    a, b = (synced(gateway_factory(redis_url=REDIS, key_cache_ttl=3600)) for _ in range(2))
    channel = b.app.components.bus.channel
    with redis.Redis.from_url(REDIS) as server:  # both listen: a message from now on is heard
        wait_for(lambda: dict(server.pubsub_numsub(channel)).get(channel.encode(), 0) >= 2)
    return a, b


@contextlib.contextmanager
def cached_on(gateway: Gateway, key: str) -> Iterator[httpx.Client]:
    with gateway.client(key) as client:
        assert client.post("/v1/systemone", json=decision()).status_code == 200  # cached there for an hour
        yield client


def refused(client: httpx.Client, status: int) -> None:
    wait_for(lambda: client.post("/v1/systemone", json=decision()).status_code == status)


def key_id(admin: httpx.Client, project: str = "acme") -> int:
    return int(body(admin.get(f"/admin/projects/{project}/keys"), 200)["data"][0]["id"])


def test_a_revocation_through_one_gateway_reaches_the_other(stack: Stack, pair: tuple[Gateway, Gateway]) -> None:
    a, b = pair
    with cached_on(b, stack.project_key) as tenant, a.client(stack.admin_key) as admin:
        body(admin.post(f"/admin/keys/{key_id(admin)}/revoke"), 200)
        refused(tenant, 401)


def test_a_rotation_without_grace_reaches_the_other(stack: Stack, pair: tuple[Gateway, Gateway]) -> None:
    a, b = pair
    with cached_on(b, stack.project_key) as tenant, a.client(stack.admin_key) as admin:
        new = body(admin.post(f"/admin/keys/{key_id(admin)}/rotate", json={"grace_seconds": 0}), 201)["key"]
        refused(tenant, 401)  # the old key expired as it was rotated
    with b.client(new) as successor:
        assert successor.post("/v1/systemone", json=decision()).status_code == 200


def test_an_archived_project_reaches_the_other(stack: Stack, pair: tuple[Gateway, Gateway]) -> None:
    a, b = pair
    with cached_on(b, stack.project_key) as tenant, a.client(stack.admin_key) as admin:
        body(admin.patch("/admin/projects/acme", json={"archived": True}), 200)
        refused(tenant, 403)
