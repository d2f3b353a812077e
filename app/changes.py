"""Telling every replica that something changed (a key revoked, an allowlist edited, a model
installed), so it takes effect everywhere within a second: Redis pub/sub when
ARBITER_REDIS_URL is set. Without Redis the caches' TTL and the registry's reload interval
are the fallback (docs/deploy.md says so)."""

from __future__ import annotations

import asyncio
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

    async def publish(self, kind: str) -> None:
        if self._redis is None:
            return
        try:
            await asyncio.wait_for(self._redis.publish(CHANNEL, f"{kind}:{self.origin}"), timeout=1.0)
        except (RedisError, OSError, TimeoutError) as exc:  # the change is made; others catch up by TTL
            log.warning("could not publish a '%s' change: %s", kind, type(exc).__name__)

    async def listen(self, handlers: dict[str, Callable[[], Awaitable[None]]]) -> None:
        """Apply other replicas' changes as they come; reconnect with back-off."""
        if self._redis is None:
            return
        delay = 0.5
        while True:
            try:
                pubsub = self._redis.pubsub()
                await pubsub.subscribe(CHANNEL)
                delay = 0.5
                async for message in pubsub.listen():
                    if message.get("type") != "message":
                        continue
                    data = message["data"]
                    kind, _, origin = (data.decode() if isinstance(data, bytes) else str(data)).partition(":")
                    if origin != self.origin and kind in handlers:
                        await handlers[kind]()
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError, TimeoutError) as exc:  # Redis away: retry, the TTLs cover the gap
                log.warning("change notifications interrupted (%s); reconnecting", type(exc).__name__)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
