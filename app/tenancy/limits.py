"""Rate limits per project and per key: requests and tokens per minute (SPEC §3, issue 7).

The algorithm is GCRA (a token bucket kept as one timestamp): a limit of N per minute lets
N through at once and then one every 60/N seconds. Counters live in this process, or in
Redis (ARBITER_REDIS_URL) so a limit holds across every replica; the Redis update is one
Lua script, atomic, on Redis's own clock.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Protocol

from redis.exceptions import RedisError

from app.errors import BackendFailed, RateLimited

log = logging.getLogger("arbiter.limits")
WINDOW = 60.0


@dataclass(frozen=True, slots=True)
class Limit:
    """One bucket: a name (``project:3:rpm``) and how many per minute."""

    key: str
    per_minute: int


class Store(Protocol):
    async def take(self, limit: Limit, cost: float, *, reject: bool) -> float:
        """Spend ``cost``; returns 0.0, or (when ``reject`` and over) seconds until allowed."""


class LocalStore:
    """Counters of this process only (no Redis): a limit holds per replica."""

    def __init__(self) -> None:
        self._tat: dict[str, float] = {}

    async def take(self, limit: Limit, cost: float, *, reject: bool) -> float:
        now = time.monotonic()
        interval = WINDOW / limit.per_minute
        tat = max(self._tat.get(limit.key, now), now)
        new_tat = tat + interval * cost
        if reject and new_tat - now > WINDOW + 1e-9:
            return new_tat - WINDOW - now
        self._tat[limit.key] = new_tat
        if len(self._tat) > 200_000:
            self._tat = {k: v for k, v in self._tat.items() if v > now}
        return 0.0


_GCRA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local interval = tonumber(ARGV[1])
local cost = tonumber(ARGV[2])
local window = tonumber(ARGV[3])
local reject = ARGV[4] == '1'
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local new_tat = tat + interval * cost
if reject and new_tat - now > window + 0.000001 then
  return tostring(new_tat - window - now)
end
redis.call('SET', KEYS[1], tostring(new_tat), 'PX', math.ceil((new_tat - now + window) * 1000))
return '0'
"""


class RedisStore:
    """Counters in Redis, shared by every replica."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._script = client.register_script(_GCRA)

    async def take(self, limit: Limit, cost: float, *, reject: bool) -> float:
        result = await self._script(keys=[f"arbiter:rl:{limit.key}"],
                                    args=[WINDOW / limit.per_minute, cost, WINDOW, "1" if reject else "0"])
        return float(result)


class RateLimiter:
    """Admits requests and charges tokens; reports whether its store is reachable."""

    def __init__(self, store: Store, *, fail_open: bool, shared: bool,
                 on_limited: Any = None) -> None:
        self._on_limited = on_limited
        self._store = store
        self._fail_open = fail_open
        self.shared = shared
        self.healthy = True
        self.limited = 0  # requests refused with 429, for the metric

    async def admit(self, requests: list[Limit], tokens: list[Limit]) -> None:
        """Raise RateLimited (429) when a request or token budget is spent."""
        for limit in requests:
            await self._spend(limit, 1.0, "requests")
        for limit in tokens:
            await self._spend(limit, 1.0, "tokens")  # one token to enter; the rest when the answer says

    async def charge(self, tokens: list[Limit], used: int) -> None:
        """Tokens are known after the answer: spend them (the next requests pay the debt)."""
        if used <= 1:
            return  # admit() took one already
        for limit in tokens:
            try:
                await self._guard(self._store.take(limit, float(used - 1), reject=False))
            except BackendFailed:
                log.warning("could not charge %d tokens to %s: the rate-limit store is unreachable", used,
                            limit.key)

    async def _spend(self, limit: Limit, cost: float, what: str) -> None:
        try:
            wait = await self._guard(self._store.take(limit, cost, reject=True))
        except BackendFailed:
            if self._fail_open:
                return
            raise
        if wait > 0:
            self.limited += 1
            if self._on_limited is not None:
                self._on_limited()
            scope = limit.key.split(":")[0]
            raise RateLimited(f"the {scope}'s limit of {limit.per_minute} {what} per minute is spent; "
                              f"retry in {math.ceil(wait)} s", headers={"Retry-After": str(max(1, math.ceil(wait)))})

    async def _guard(self, work: Any) -> float:
        try:
            result = float(await asyncio.wait_for(work, timeout=1.0))
        except Exception as exc:  # any failure of the store: unreachable, timeout, protocol
            if self.healthy:
                log.error("the rate-limit store is unreachable: %s", type(exc).__name__)
            self.healthy = False
            raise BackendFailed(503, "rate limits cannot be checked right now (Redis is unreachable); "
                                     "try again shortly", retry_after=5) from exc
        self.healthy = True
        return result

    async def ping(self) -> bool:
        """For /readyz: can the store be reached?"""
        if isinstance(self._store, RedisStore):
            try:
                await asyncio.wait_for(self._store._client.ping(), timeout=1.0)
                self.healthy = True
            except (RedisError, OSError, TimeoutError):
                self.healthy = False
        return self.healthy


def limits_of(principal: Any) -> tuple[list[Limit], list[Limit]]:
    """The request and token buckets that apply to a principal (project's, then key's)."""
    requests: list[Limit] = []
    tokens: list[Limit] = []
    for scope, ident, rpm, tpm in (("project", principal.project_id, principal.project_rpm, principal.project_tpm),
                                   ("key", principal.key_id, principal.key_rpm, principal.key_tpm)):
        if rpm:
            requests.append(Limit(f"{scope}:{ident}:rpm", rpm))
        if tpm:
            tokens.append(Limit(f"{scope}:{ident}:tpm", tpm))
    return requests, tokens
