"""The key cache: hits skip the database, misses are shared, a database outage fails closed."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import threading
import time
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError, ProgrammingError

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


class Database:
    """A loader whose database can be taken away, counting its lookups."""

    def __init__(self, answer: Principal | None) -> None:
        self.answer = answer
        self.error: Exception | None = None
        self.calls = 0

    def __call__(self, _digest: str) -> Principal | None:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return self.answer

    def away(self) -> None:
        self.error = OperationalError("SELECT", {}, Exception("connection refused"))


async def outcome(cache: KeyCache) -> Principal | Exception:
    try:
        return await cache.authenticate(f"Bearer {KEY}", "project")
    except (AuthenticationFailed, BackendFailed) as exc:
        return exc


def status(result: Principal | Exception) -> int:
    return 200 if isinstance(result, Principal) else int(getattr(result, "status", 0))


def test_a_key_verified_lately_keeps_working_while_the_database_is_away(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past its TTL, a key the database found valid within the stale window is served from memory
    while lookups fail for the database's sake; once it answers again, what it says counts."""
    monkeypatch.setattr("app.tenancy.keycache.AWAY_RETRY", 0.0)
    database = Database(principal())

    async def scenario() -> list[int]:
        cache = KeyCache(HASHER, database, ttl=0, stale=60)
        seen = [status(await outcome(cache))]
        database.away()
        seen += [status(await outcome(cache)) for _ in range(5)]
        database.error = None
        database.answer = dataclasses.replace(principal(), revoked_at=dt.datetime.now(dt.UTC))
        deadline = time.monotonic() + 10
        while status(await outcome(cache)) == 200:  # re-read in the background: refused once it is
            assert time.monotonic() < deadline, "the key was never verified again"
            await asyncio.sleep(0.01)
        seen.append(status(await outcome(cache)))
        return seen

    assert asyncio.run(scenario()) == [200, 200, 200, 200, 200, 200, 401]


def test_while_the_database_is_away_stale_keys_wait_for_no_lookup() -> None:
    """Once a lookup has failed, the stale key is answered at once; re-reads go on in the background,
    at most one per AWAY_RETRY."""
    database = Database(principal())

    async def scenario() -> int:
        cache = KeyCache(HASHER, database, ttl=0, stale=60)
        await outcome(cache)
        database.away()
        for _ in range(50):
            assert status(await outcome(cache)) == 200
        await asyncio.sleep(0.05)  # a background re-read finishes
        return database.calls

    assert asyncio.run(scenario()) <= 3  # the first, the failed one, perhaps one background re-read


def test_what_the_database_answered_is_never_overridden_by_an_outage() -> None:
    """A key it said was revoked stays refused (401); a key it never found valid gets 503, not 401."""
    revoked = Database(dataclasses.replace(principal(), revoked_at=dt.datetime.now(dt.UTC)))
    unknown = Database(None)

    async def scenario(database: Database) -> list[int]:
        cache = KeyCache(HASHER, database, ttl=0, stale=60)
        seen = [status(await outcome(cache))]
        database.away()
        seen += [status(await outcome(cache)) for _ in range(2)]
        return seen

    assert asyncio.run(scenario(revoked)) == [401, 401, 401]
    assert asyncio.run(scenario(unknown))[1:] == [503, 503]  # its brief negative entry lasts no TTL of 0


def test_past_the_stale_window_or_after_a_known_change_the_key_gets_503() -> None:
    async def scenario(stale: float, invalidate: bool) -> int:
        database = Database(principal())
        cache = KeyCache(HASHER, database, ttl=0, stale=stale)
        await outcome(cache)
        database.away()
        if invalidate:
            cache.invalidate()  # a revocation heard of: nothing kept
        return status(await outcome(cache))

    assert asyncio.run(scenario(0, invalidate=False)) == 503
    assert asyncio.run(scenario(60, invalidate=True)) == 503
    assert asyncio.run(scenario(60, invalidate=False)) == 200


def test_an_expiry_time_holds_on_a_stale_key() -> None:
    soon = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=0.3)
    database = Database(dataclasses.replace(principal(), expires_at=soon))

    async def scenario() -> list[int]:
        cache = KeyCache(HASHER, database, ttl=0, stale=60)
        seen = [status(await outcome(cache))]
        database.away()
        while dt.datetime.now(dt.UTC) <= soon:
            await asyncio.sleep(0.05)
        return [*seen, status(await outcome(cache))]

    assert asyncio.run(scenario()) == [200, 401]


def test_expire_reads_every_key_again_but_keeps_them_for_an_outage() -> None:
    """What the change bus does when it may have missed a change: nothing says which key it was."""
    database = Database(principal())

    async def scenario() -> tuple[int, int, int]:
        cache = KeyCache(HASHER, database, ttl=60, stale=60)
        await outcome(cache)
        cache.expire()
        await outcome(cache)
        looked_up = database.calls  # read again, though its TTL had not run out
        cache.expire()
        database.away()
        return looked_up, status(await outcome(cache)), database.calls

    assert asyncio.run(scenario()) == (2, 200, 3)


def test_an_error_the_database_answers_with_keeps_no_stale_key() -> None:
    """Only a database that cannot be reached lets a stale key through, not one that answers with an
    error (a broken schema, a bug)."""
    database = Database(principal())

    async def scenario() -> int:
        cache = KeyCache(HASHER, database, ttl=0, stale=60)
        await outcome(cache)
        database.error = ProgrammingError("SELECT", {}, Exception("no such column"))
        return status(await outcome(cache))

    assert asyncio.run(scenario()) == 503
