"""Change notifications between replicas (Redis pub/sub): a failing handler does not stop them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.asyncio

from app.changes import ChangeBus
from tests.support import redis_url

REDIS = redis_url(0)


async def settled(check: Callable[[], Any], timeout: float = 10.0) -> None:
    """Wait until ``check()`` is true (a generous deadline: the host may be loaded)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "not true in time"
        await asyncio.sleep(0.02)


def need_redis() -> None:
    try:
        redis.Redis.from_url(REDIS, socket_timeout=1).ping()
    except redis.RedisError:
        pytest.skip("no Redis at 127.0.0.1:6379")


async def quiet_then_stop(listening: asyncio.Task[None], *clients: Any) -> None:
    """Let a moment pass (nothing more may be applied), then stop the listener and close its clients."""
    await asyncio.sleep(0.1)
    listening.cancel()
    await asyncio.gather(listening, return_exceptions=True)
    for client in clients:
        await client.aclose()


async def subscribers(client: Any, channel: str) -> int:
    """How many subscriptions to ``channel`` the Redis server has."""
    return int(dict(await client.pubsub_numsub(channel)).get(channel.encode(), 0))


def test_a_failing_handler_does_not_stop_the_listener() -> None:
    need_redis()

    async def scenario() -> list[str]:
        seen: list[str] = []
        listener_client = redis.asyncio.from_url(REDIS)
        sender_client = redis.asyncio.from_url(REDIS)
        listener, sender = ChangeBus(listener_client), ChangeBus(sender_client)

        async def keys() -> None:
            seen.append("keys")
            if len(seen) == 1:  # the catch-up at the first subscription
                raise RuntimeError("the database is away")

        task = asyncio.create_task(listener.listen({"keys": keys}))
        await settled(lambda: len(seen) == 1)  # subscribed: the catch-up comes once it is
        for expected in (2, 3, 4):
            await sender.publish("keys")
            await settled(lambda: len(seen) == expected)  # noqa: B023 - called before the next round
        await quiet_then_stop(task, listener_client, sender_client)
        return seen

    assert asyncio.run(scenario()) == ["keys", "keys", "keys", "keys"]  # the catch-up, then three changes


def test_deployments_on_other_redis_databases_are_not_heard() -> None:
    """Pub/sub ignores database numbers; the channel does not: a deployment on database N hears only
    publishers on database N, even with another one on the same server."""
    other = REDIS.rsplit("/", 1)[0] + f"/{int(REDIS.rsplit('/', 1)[1]) + 1}"
    need_redis()

    async def scenario() -> tuple[list[str], str, str]:
        seen: list[str] = []
        clients = [redis.asyncio.from_url(url) for url in (REDIS, REDIS, other)]
        listener, same, elsewhere = (ChangeBus(client) for client in clients)

        async def models() -> None:
            seen.append("same database")

        task = asyncio.create_task(listener.listen({"models": models}))
        await settled(lambda: bool(seen))
        assert seen == ["same database"]  # the catch-up at the first subscription
        seen.clear()
        await elsewhere.publish("models")
        await same.publish("models")  # after the other: had that one been heard, it came first
        await settled(lambda: bool(seen))
        await quiet_then_stop(task, *clients)
        return seen, listener.channel, elsewhere.channel

    seen, mine, theirs = asyncio.run(scenario())
    assert seen == ["same database"]
    assert mine != theirs and mine.startswith("arbiter:changes:")


def redis_behind_a_proxy() -> tuple[Any, str]:
    """A TCP proxy in front of the test Redis (to cut it), and the Redis database number."""
    from tests.reliability.proxy import TcpProxy

    need_redis()
    host_port, db = REDIS.split("//", 1)[1].rsplit("/", 1)
    return TcpProxy(host_port.split(":")[0], int(host_port.split(":")[1])).up(), db


def test_changes_made_before_the_first_subscription_are_caught_up() -> None:
    """A replica loads keys and models at start-up, then subscribes: a change published between the
    two is gone by the time the subscription takes, so the first subscription applies every kind
    once, with no message at all."""
    need_redis()

    async def scenario() -> list[str]:
        seen: list[str] = []
        client = redis.asyncio.from_url(REDIS)

        async def keys() -> None:
            seen.append("keys")

        async def models() -> None:
            seen.append("models")

        task = asyncio.create_task(ChangeBus(client).listen({"keys": keys, "models": models}))
        await settled(lambda: len(seen) >= 2)
        await quiet_then_stop(task, client)
        return seen

    assert asyncio.run(scenario()) == ["keys", "models"]


def test_changes_missed_while_redis_was_away_are_caught_up_on_reconnecting() -> None:
    """A key revoked while this replica's subscription was down: its message is gone, so the
    listener applies every kind of change once when it is back."""
    proxy, db = redis_behind_a_proxy()

    async def scenario() -> list[str]:
        seen: list[str] = []
        listener_client = redis.asyncio.from_url(f"redis://127.0.0.1:{proxy.port}/{db}", socket_timeout=1)
        sender_client = redis.asyncio.from_url(REDIS)
        listener, sender = ChangeBus(listener_client), ChangeBus(sender_client)

        async def keys() -> None:
            seen.append("keys")

        async def models() -> None:
            seen.append("models")

        task = asyncio.create_task(listener.listen({"keys": keys, "models": models}))
        await settled(lambda: len(seen) == 2)
        seen.clear()  # the catch-up at the first subscription
        subscribed = await subscribers(sender_client, listener.channel)
        proxy.down()
        deadline = asyncio.get_running_loop().time() + 10
        while await subscribers(sender_client, listener.channel) >= subscribed:  # Redis dropped it
            assert asyncio.get_running_loop().time() < deadline, "the subscription outlived the proxy"
            await asyncio.sleep(0.02)
        await sender.publish("keys")  # missed: nobody is subscribed through the proxy
        proxy.up()
        await settled(lambda: len(seen) >= 2, timeout=20)  # its back-off may have grown to a few seconds
        await quiet_then_stop(task, listener_client, sender_client)
        return seen

    try:
        assert sorted(asyncio.run(scenario())) == ["keys", "models"]
    finally:
        proxy.stop()


def test_the_first_command_after_a_redis_blip_goes_through() -> None:
    """The pool's connections died with the blip: the first command on one is retried once on a
    new connection, not failed (a spurious 503 from the rate limiter)."""
    from app.components import _redis_client
    from app.settings import Settings
    proxy, db = redis_behind_a_proxy()
    settings = Settings(database_url="sqlite://", redis_url=f"redis://127.0.0.1:{proxy.port}/{db}")

    async def scenario() -> list[bool]:
        client = _redis_client(settings)
        answers = [bool(await client.ping())]
        proxy.down()
        proxy.up()
        answers.append(bool(await client.ping()))
        await client.aclose()
        return answers

    try:
        assert asyncio.run(scenario()) == [True, True]
    finally:
        proxy.stop()


class _FailingRedis:
    """A publish that fails (Redis unreachable) when the test says."""

    connection_pool = None

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.outcome: asyncio.Future[None] | None = None

    async def publish(self, channel: str, message: str) -> None:
        self.outcome = asyncio.get_running_loop().create_future()
        self.entered.set()
        await self.outcome


def test_a_publish_that_fails_as_its_task_is_cancelled_is_still_a_cancel() -> None:
    """Python 3.11's wait_for hands back the inner result, here Redis's ConnectionError, when
    the cancel of the task waiting on it comes as it finishes: the cancel was lost, and the
    stopping service sync went on to its minutes-long sleep, holding the gateway's shutdown."""
    async def scenario() -> None:
        client = _FailingRedis()
        bus = ChangeBus(client)
        after: list[str] = []

        async def a_sync_loop() -> None:
            await bus.publish("models")
            after.append("went on")
            await asyncio.sleep(60)

        task = asyncio.ensure_future(a_sync_loop())
        await client.entered.wait()
        assert client.outcome is not None
        client.outcome.set_exception(redis.exceptions.ConnectionError("refused"))
        task.cancel()  # in the same turn of the loop
        done, _ = await asyncio.wait([task], timeout=2)
        assert done and task.cancelled() and after == []

    asyncio.run(scenario())


def test_a_catch_up_runs_its_own_handler_and_messages_the_usual_one() -> None:
    """On (re)subscribing nothing says which key changed: the key cache is asked to verify every key
    again (keeping them for a database outage) instead of dropping them; a message drops them."""
    need_redis()

    async def scenario() -> list[str]:
        seen: list[str] = []
        listener_client, sender_client = redis.asyncio.from_url(REDIS), redis.asyncio.from_url(REDIS)
        listener, sender = ChangeBus(listener_client), ChangeBus(sender_client)

        async def dropped() -> None:
            seen.append("invalidate")

        async def expired() -> None:
            seen.append("expire")

        task = asyncio.create_task(listener.listen({"keys": dropped}, catch_up={"keys": expired}))
        await settled(lambda: seen == ["expire"])
        await sender.publish("keys")
        await settled(lambda: len(seen) == 2)
        await quiet_then_stop(task, listener_client, sender_client)
        return seen

    assert asyncio.run(scenario()) == ["expire", "invalidate"]
