"""Redis going away (issue 31): each replica counts its share of every limit (the limit divided
by the replicas counted in the database) instead of refusing every limited request, says so in
/readyz and a metric, and when Redis returns, even empty, hands what it spent to the shared
buckets first, so the minute after gives no fresh burst on top of the outage's spending."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from tests.reliability.proxy import TcpProxy
from tests.support import Gateway, Stack, closed_port, decision, redis_url, wait_for

REDIS = redis_url(1)


def set_rpm(stack: Stack, rpm: int) -> None:
    with stack.client("admin") as admin:
        assert admin.patch("/admin/projects/acme", json={"requests_per_minute": rpm}).status_code == 200


def codes(gateway: Gateway, key: str, n: int) -> list[int]:
    with gateway.client(key) as client:
        return [client.post("/v1/systemone", json=decision()).status_code for _ in range(n)]


def ready(gateway: Gateway) -> dict[str, Any]:
    with gateway.client(None) as client:
        answer = client.get("/readyz")
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def two_replicas(gateway_factory: Callable[..., Gateway], url: str) -> list[Gateway]:
    """Two gateways on the one database and Redis, once each counts the other."""
    replicas = [gateway_factory(redis_url=url) for _ in range(2)]
    for gateway in replicas:
        wait_for(lambda gateway=gateway: gateway.app.components.replica_count.count == 2)
    return replicas


def test_with_redis_unreachable_each_replica_counts_its_share(stack: Stack, gateway_factory: Any) -> None:
    set_rpm(stack, 10)
    a, b = two_replicas(gateway_factory, f"redis://127.0.0.1:{closed_port()}/0")
    # 5 of 10 on each (not 503 for all of them, nor 10 on each): 10 in all, as with Redis.
    assert codes(a, stack.project_key, 7) == [200] * 5 + [429] * 2
    assert codes(b, stack.project_key, 7) == [200] * 5 + [429] * 2
    with a.client(stack.project_key) as client:
        refused = client.post("/v1/systemone", json=decision())
    assert refused.status_code == 429 and refused.headers["retry-after"]
    assert "limit of 10 requests per minute" in refused.json()["error"]
    assert "share while Redis is unreachable: 5" in refused.json()["error"]
    answer = ready(a)
    assert answer["redis"] == "unreachable" and answer["rate_limits"] == "local_share"
    assert answer["replicas"] == 2 and "1/2" in answer["degraded"]
    with a.client(stack.admin_key) as admin:
        scraped = admin.get("/metrics").text
    assert "arbiter_rate_limit_fallback 1.0" in scraped and "arbiter_rate_limit_replicas 2.0" in scraped
    assert "arbiter_redis_up 0.0" in scraped


@pytest.fixture
def proxied_redis() -> Iterator[tuple[TcpProxy, str]]:
    try:
        redis.Redis.from_url(REDIS, socket_timeout=1).flushdb()
    except redis.RedisError:
        pytest.skip("no Redis at 127.0.0.1:6379")
    proxy = TcpProxy("127.0.0.1", 6379).up()
    yield proxy, f"redis://127.0.0.1:{proxy.port}/{REDIS.rsplit('/', 1)[1]}"
    proxy.stop()


def test_when_redis_returns_empty_the_outage_s_spending_is_kept(
        stack: Stack, gateway_factory: Any, proxied_redis: tuple[TcpProxy, str]) -> None:
    proxy, url = proxied_redis
    set_rpm(stack, 10)
    replicas = two_replicas(gateway_factory, url)
    assert all(ready(gateway)["rate_limits"] == "shared" for gateway in replicas)
    proxy.down()
    for gateway in replicas:  # the project spends its limit during the outage, a share on each
        assert codes(gateway, stack.project_key, 6) == [200] * 5 + [429]
        assert ready(gateway)["rate_limits"] == "local_share"
    redis.Redis.from_url(REDIS).flushdb()  # Redis restarted without its data
    proxy.up()
    for gateway in replicas:  # each finds Redis by itself (its probe), hands back, shares again
        wait_for(lambda gateway=gateway: ready(gateway)["rate_limits"] == "shared")
    after = codes(replicas[0], stack.project_key, 5) + codes(replicas[1], stack.project_key, 5)
    # Without the hand-back an empty Redis lets all 10 through at once (and one replica's share
    # alone would be 5); with it, only what a minute's refill gave back since the outage (one
    # request every 6 s) comes through.
    assert after.count(200) <= 3 and set(after) <= {200, 429}, after
    with replicas[0].client(stack.admin_key) as admin:
        assert "arbiter_rate_limit_fallback 0.0" in admin.get("/metrics").text
