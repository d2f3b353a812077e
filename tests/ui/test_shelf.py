"""The one-time shelf for a new key (Post/Redirect/Get): once, per session and project, and through
Redis (encrypted) when the replicas share one."""

from __future__ import annotations

import logging

import pytest

from app.db.session import Database
from app.errors import BackendFailed
from app.mesh.nonces import DatabaseNonces, NonceStore
from app.ui.session import UiSession
from app.ui.shelf import SPENT_SECONDS, KeyShelf
from tests.support import redis_url, run_async

MINE, OTHER = UiSession(1, 2_000_000_000, "a" * 32), UiSession(1, 2_000_000_000, "b" * 32)
VIEW = {"id": 7, "key": "arb_proj_secret"}


@pytest.fixture
def spent(db: Database) -> NonceStore:
    """The store the app gives its shelf: the database's nonce table."""
    return DatabaseNonces(db, SPENT_SECONDS)


def test_a_key_is_taken_once_by_its_session_and_project(spent: NonceStore) -> None:
    async def walk() -> None:
        shelf = KeyShelf(spent)
        await shelf.put(MINE, 3, VIEW)
        assert await shelf.take(OTHER, 3) is None and await shelf.take(MINE, 4) is None
        assert await shelf.take(MINE, 3) == VIEW
        assert await shelf.take(MINE, 3) is None
    run_async(walk())


def test_through_redis_another_replica_shows_it_and_it_is_sealed(spent: NonceStore) -> None:
    redis_asyncio = pytest.importorskip("redis.asyncio")
    redis_exceptions = pytest.importorskip("redis.exceptions")

    async def walk() -> None:
        client = redis_asyncio.from_url(redis_url(2))
        try:
            await client.ping()
        except (OSError, redis_exceptions.RedisError):
            pytest.skip("no Redis here")
        try:
            one, two = KeyShelf(spent, client, "s" * 32), KeyShelf(spent, client, "s" * 32)
            await one.put(MINE, 3, VIEW)
            stored = [await client.get(k) for k in await client.keys("arbiter:ui:new-key:*")]
            assert stored and all(b"arb_proj_secret" not in v for v in stored)  # encrypted at rest
            assert await two.take(MINE, 3) == VIEW and await one.take(MINE, 3) is None
        finally:
            await client.aclose()
    run_async(walk())


def test_with_a_secret_and_no_redis_the_browser_carries_it_sealed(spent: NonceStore) -> None:
    async def walk() -> None:
        one, two = KeyShelf(spent, None, "s" * 32), KeyShelf(spent, None, "s" * 32)
        foreign = KeyShelf(spent, None, "t" * 32)
        carried = await one.put(MINE, 3, VIEW)
        assert carried is not None and "arb_proj_secret" not in carried
        assert await two.take(MINE, 3, carried) == VIEW  # another replica with the same secret
        assert await two.take(OTHER, 3, carried) is None and await two.take(MINE, 4, carried) is None
        assert await foreign.take(MINE, 3, carried) is None and await two.take(MINE, 3, "forged") is None
        assert await KeyShelf(spent).put(MINE, 3, VIEW) is None  # no secret: one process, its memory
    run_async(walk())


def test_a_carried_key_stays_well_under_a_browsers_cookie_limit(spent: NonceStore) -> None:
    async def walk() -> None:
        view = {"key": "arb_proj_" + "x" * 43, "name": "\U0001F511" * 200, "replaces": "arb_proj_ab…wxyz",
                "old_until": "2026-12-01T10:00:00+00:00"}
        carried = await KeyShelf(spent, None, "s" * 32).put(MINE, 3, view)
        assert carried is not None and len("arbiter_new_key=" + carried) < 3000  # browsers drop a cookie over 4,096
        assert await KeyShelf(spent, None, "s" * 32).take(MINE, 3, carried) == view
    run_async(walk())


class Unreachable:
    async def first_use(self, nonce: str) -> bool:
        raise BackendFailed(503, "the nonce store is unreachable")

    async def purge(self) -> None:
        raise AssertionError("nothing to purge when nothing was recorded")


def test_a_carried_key_is_shown_once_even_when_its_cookie_comes_back(spent: NonceStore,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    async def walk() -> None:
        carried = await KeyShelf(spent, None, "s" * 32).put(MINE, 3, VIEW)
        assert carried is not None
        replica = KeyShelf(spent, None, "s" * 32)
        assert await replica.take(MINE, 3, carried) == VIEW
        assert await replica.take(MINE, 3, carried) is None  # the same cookie again: spent
        other = await KeyShelf(spent, None, "s" * 32).put(MINE, 3, VIEW)  # a second key: a cookie of its own
        assert other is not None and await replica.take(MINE, 3, other) == VIEW
        assert await KeyShelf(Unreachable(), None, "s" * 32).take(MINE, 3, carried) is None  # cannot tell: not shown
    with caplog.at_level(logging.WARNING, "arbiter.ui"):
        run_async(walk())
    assert "came back after its display" in caplog.text and "it is not shown" in caplog.text
