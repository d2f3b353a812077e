"""Telling every replica that something changed (a key revoked, an allowlist edited, a model
installed), so it takes effect everywhere within a second: Redis pub/sub when
ARBITER_REDIS_URL is set. Without Redis the caches' TTL and the registry's reload interval
are the fallback (docs/deploy.md says so)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from redis.exceptions import RedisError

log = logging.getLogger("arbiter.changes")
CHANNEL = "arbiter:changes"
KINDS = ("keys", "models")


class ChangeBus:
    def __init__(self, redis: Any | None) -> None:
        self._redis = redis
        self.origin = uuid.uuid4().hex  # this process: its own messages are not applied twice
        # Redis pub/sub ignores database numbers: a message published while on database 3 reaches
        # subscribers on every database. The channel names the database, so deployments sharing
        # one Redis server on different databases do not hear each other's changes.
        pool = getattr(redis, "connection_pool", None)
        self.channel = f"{CHANNEL}:{getattr(pool, 'connection_kwargs', {}).get('db', 0)}"

    async def publish(self, kind: str) -> None:
        if self._redis is None:
            return
        try:
            await asyncio.wait_for(self._redis.publish(self.channel, f"{kind}:{self.origin}"), timeout=1.0)
        except (RedisError, OSError, TimeoutError) as exc:  # the change is made; others catch up by TTL
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                # redis-py can turn a cancellation that reaches it mid-connect into its own
                # ConnectionError: the caller (a stopping task) must still see it as a cancel.
                raise asyncio.CancelledError from exc
            log.warning("could not publish a '%s' change: %s", kind, type(exc).__name__)

    async def listen(self, handlers: dict[str, Callable[[], Awaitable[None]]],
                     catch_up: dict[str, Callable[[], Awaitable[None]]] | None = None) -> None:
        """Apply other replicas' changes as they come; reconnect with back-off. ``catch_up``: what
        to run instead of a kind's handler when changes of it may have been missed (none is known)."""
        if self._redis is None:
            return
        delay = 0.5
        interrupted = False
        first = True
        while True:
            pubsub = self._redis.pubsub()
            try:
                await pubsub.subscribe(self.channel)
                delay = 0.5
                if first or interrupted:
                    # Messages published before this subscription took (between the start-up's
                    # first load and now, or while the connection was down) are gone: apply every
                    # kind once (drop cached keys, reload models and peers), so none is missed.
                    if interrupted:
                        log.info("change notifications back; catching up on what may have been missed")
                    first = interrupted = False
                    for kind, handler in handlers.items():
                        await _apply(kind, (catch_up or {}).get(kind, handler))
                async for message in pubsub.listen():
                    if message.get("type") != "message":
                        continue
                    data = message["data"]
                    kind, _, origin = (data.decode() if isinstance(data, bytes) else str(data)).partition(":")
                    if origin != self.origin and kind in handlers:
                        await _apply(kind, handlers[kind])
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError, TimeoutError) as exc:  # Redis away: retry, the TTLs cover the gap
                log.warning("change notifications interrupted (%s); reconnecting", type(exc).__name__)
                interrupted = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
            finally:
                with contextlib.suppress(RedisError, OSError, TimeoutError):
                    await pubsub.aclose()


async def _apply(kind: str, handler: Callable[[], Awaitable[None]]) -> None:
    """One change; a failure (the database away during a reload) must not stop the listener."""
    try:
        await handler()
    except Exception:
        log.exception("applying a '%s' change failed; the periodic reload will catch up", kind)
