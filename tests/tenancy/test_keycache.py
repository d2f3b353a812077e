"""The key cache: hits skip the database, misses are shared, a database outage fails closed."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import threading
import time
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from app.errors import AuthenticationFailed, BackendFailed
from app.tenancy.keycache import KeyCache
from app.tenancy.keys import KeyHasher
from app.tenancy.principal import Principal

HASHER = KeyHasher()
KEY = HASHER.new("project").value


def principal() -> Principal:
    return Principal(key_id=1, kind="project", key_prefix=KEY[:13], project_id=1, project_name="p",
                     allowed_models=None, archived=False, expires_at=None, revoked_at=None)


def test_a_cached_key_needs_no_database() -> None:
    calls: list[str] = []

    def loader(digest: str) -> Principal:
        calls.append(digest)
        return principal()

    cache = KeyCache(HASHER, loader, ttl=60)
    for _ in range(5):
        assert asyncio.run(cache.authenticate(f"Bearer {KEY}", "project")).key_id == 1
    assert len(calls) == 1
    cache.invalidate()
    asyncio.run(cache.authenticate(f"Bearer {KEY}", "project"))
    assert len(calls) == 2


def test_concurrent_misses_share_one_lookup() -> None:
    calls = 0
    lock = threading.Lock()

    def loader(_digest: str) -> Principal:
        nonlocal calls
        with lock:
            calls += 1
        time.sleep(0.2)
        return principal()

    async def burst() -> list[Principal]:
        cache = KeyCache(HASHER, loader, ttl=60)
        return await asyncio.gather(*(cache.authenticate(f"Bearer {KEY}", "project") for _ in range(20)))

    assert len(asyncio.run(burst())) == 20
    assert calls == 1


def test_a_database_outage_fails_closed_with_503() -> None:
    def loader(_digest: str) -> Principal:
        raise OperationalError("SELECT", {}, Exception("connection refused"))

    async def attempt() -> None:
        cache = KeyCache(HASHER, loader, ttl=60)
        await asyncio.gather(*(cache.authenticate(f"Bearer {KEY}", "project") for _ in range(3)))

    with pytest.raises(BackendFailed) as info:
        asyncio.run(attempt())
    assert info.value.status == 503 and info.value.headers["Retry-After"] == "5"


def test_unknown_keys_are_never_cached_as_valid() -> None:
    cache = KeyCache(HASHER, lambda _d: None, ttl=60)
    with pytest.raises(AuthenticationFailed):
        asyncio.run(cache.authenticate(f"Bearer {KEY}", "project"))


def test_a_lookup_that_raced_a_revocation_is_not_cached() -> None:
    """The lookup read the row before the revoke, finished after it: its answer is stale."""
    calls = 0

    async def scenario() -> int:
        nonlocal calls
        cache: KeyCache

        reading, revoked = threading.Event(), threading.Event()

        def loader(_digest: str) -> Principal:
            nonlocal calls
            calls += 1
            if calls == 1:
                reading.set()
                revoked.wait(5)  # the revocation lands while this reads
            return principal()

        cache = KeyCache(HASHER, loader, ttl=60)
        first = asyncio.ensure_future(cache.authenticate(f"Bearer {KEY}", "project"))
        while not reading.is_set():  # the lookup is reading (a fixed pause may be too short on a loaded host)
            await asyncio.sleep(0.01)
        cache.invalidate()
        revoked.set()
        await first
        await cache.authenticate(f"Bearer {KEY}", "project")
        return calls

    assert asyncio.run(scenario()) == 2  # the second request read again


def test_a_request_after_a_revocation_does_not_join_a_lookup_from_before_it() -> None:
    """A lookup reads the row, the key is revoked and the cache invalidated, then a request
    comes: it must not share the first lookup's stale "not revoked" answer."""
    revoked = threading.Event()
    release = threading.Event()
    lookups: list[bool] = []

    def loader(_digest: str) -> Principal:
        was_revoked = revoked.is_set()  # what the database said when this lookup read it
        lookups.append(was_revoked)
        release.wait(5)
        now = dt.datetime.now(dt.UTC)
        return dataclasses.replace(principal(), revoked_at=now if was_revoked else None)

    async def scenario() -> tuple[Any, Any]:
        cache = KeyCache(HASHER, loader, ttl=60)
        before = asyncio.ensure_future(cache.authenticate(f"Bearer {KEY}", "project"))
        while not lookups:  # the lookup has read the row
            await asyncio.sleep(0.01)
        revoked.set()
        cache.invalidate()  # what the admin API does once the revocation is committed
        after = asyncio.ensure_future(cache.authenticate(f"Bearer {KEY}", "project"))
        deadline = time.monotonic() + 5
        while len(lookups) < 2 and time.monotonic() < deadline:  # its own lookup (none if it joined the first)
            await asyncio.sleep(0.01)
        release.set()
        return tuple(await asyncio.gather(before, after, return_exceptions=True))

    before, after = asyncio.run(scenario())
    assert isinstance(before, Principal)  # in flight before the revocation: served as it was
    assert isinstance(after, AuthenticationFailed) and "revoked" in str(after)


def test_waiters_are_released_whatever_the_loader_raises() -> None:
    def loader(_digest: str) -> Principal:
        time.sleep(0.1)
        raise RuntimeError("interpreter shutting down")

    async def burst() -> list[Any]:
        cache = KeyCache(HASHER, loader, ttl=60)
        return await asyncio.wait_for(asyncio.gather(
            *(cache.authenticate(f"Bearer {KEY}", "project") for _ in range(3)), return_exceptions=True), 5)

    assert all(isinstance(result, RuntimeError) for result in asyncio.run(burst()))


def test_unknown_keys_are_remembered_briefly() -> None:
    calls = 0

    def loader(_digest: str) -> None:
        nonlocal calls
        calls += 1

    async def flood() -> None:
        cache = KeyCache(HASHER, loader, ttl=60)
        for _ in range(50):
            with pytest.raises(AuthenticationFailed):
                await cache.authenticate(f"Bearer {KEY}", "project")

    asyncio.run(flood())
    assert calls == 1
