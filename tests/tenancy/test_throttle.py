"""The failed-credential throttle's counts: per address, a window from the first failure, a cap
on the addresses kept, and Redis shared by every replica."""

from __future__ import annotations

import uuid

import pytest
import redis.asyncio
from redis.exceptions import RedisError

from app.tenancy.throttle import FailureThrottle, LocalFailures, RedisFailures, client_key
from tests.support import redis_url, run_async


def test_addresses_are_counted_alone_and_ipv6_per_64() -> None:
    assert client_key("10.1.2.3") == "10.1.2.3"
    assert client_key("2001:db8:1:2:aaaa::1") == client_key("2001:db8:1:2:bbbb::9") == "2001:db8:1:2::/64"
    assert client_key("2001:db8:1:3::1") != client_key("2001:db8:1:2::1")
    assert client_key("::ffff:10.1.2.3") == "10.1.2.3"
    assert client_key(None) == "unknown"


def test_past_the_limit_an_address_waits_and_others_do_not() -> None:
    async def walk() -> None:
        throttle = FailureThrottle(LocalFailures(), limit=3, window=300)
        for _ in range(2):
            await throttle.failed("a")
        assert await throttle.retry_after("a") == 0
        await throttle.failed("a")
        wait = await throttle.retry_after("a")
        assert 290 < wait <= 300
        assert await throttle.retry_after("b") == 0
        off = FailureThrottle(LocalFailures(), limit=0, window=300)
        for _ in range(5):
            await off.failed("a")
        assert await off.retry_after("a") == 0

    run_async(walk())


def test_the_window_ends_and_counting_starts_again() -> None:
    async def walk() -> None:
        throttle = FailureThrottle(LocalFailures(), limit=1, window=1e-6)  # over before it is read
        await throttle.failed("a")
        assert await throttle.retry_after("a") == 0

    run_async(walk())


def test_memory_is_bounded_the_least_recent_address_goes_first() -> None:
    async def walk() -> None:
        failures = LocalFailures(max_clients=3)
        for address in ("a", "b", "c"):
            await failures.add(address, 300)
        await failures.add("a", 300)  # a failed again: b is now the least recent
        await failures.add("d", 300)
        assert len(failures) == 3
        assert await failures.wait("b", 1) == 0  # forgotten
        assert await failures.wait("a", 2) > 0 and await failures.wait("d", 1) > 0

    run_async(walk())


def test_redis_counts_are_shared_and_an_unreachable_redis_lets_attempts_through() -> None:
    address = f"10.{uuid.uuid4().int % 250}.{uuid.uuid4().int % 250}.1"

    async def walk() -> None:
        one, two = redis.asyncio.from_url(redis_url(0)), redis.asyncio.from_url(redis_url(0))
        try:
            await one.delete(f"arbiter:authfail:{address}")
        except (RedisError, OSError):
            pytest.skip("Redis is not running on 127.0.0.1:6379")
        try:
            first = FailureThrottle(RedisFailures(one), limit=2, window=300)
            second = FailureThrottle(RedisFailures(two), limit=2, window=300)
            await first.failed(address)
            await second.failed(address)  # another replica's failure counts too
            assert 290 < await first.retry_after(address) <= 300
            assert await second.retry_after(address) > 0
        finally:
            await one.delete(f"arbiter:authfail:{address}")
            await one.aclose()
            await two.aclose()
        gone = redis.asyncio.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.5)
        try:
            away = FailureThrottle(RedisFailures(gone), limit=1, window=300)
            await away.failed(address)
            assert await away.retry_after(address) == 0
        finally:
            await gone.aclose()

    run_async(walk())
