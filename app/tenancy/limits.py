"""Rate limits per project and per key: requests and tokens per minute (SPEC §3, issue 7).

The algorithm is GCRA (a token bucket kept as one timestamp): a limit of N per minute lets
N through at once and then one every 60/N seconds. Counters live in this process, or in
Redis (ARBITER_REDIS_URL) so a limit holds across every replica; the Redis update is one
Lua script, atomic, on Redis's own clock. A request spends from all its buckets (project's
and key's) or, refused, from none.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Sequence
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
    async def take(self, limits: Sequence[Limit], cost: float, *, reject: bool) -> tuple[float, int]:
        """Spend ``cost`` from every bucket of ``limits``, or (when ``reject`` and one of them is
        over) from none: returns (0.0, -1), or the seconds until all allow it and the index of
        the bucket that waits longest."""


class LocalStore:
    """Counters of this process only (no Redis): a limit holds per replica."""

    def __init__(self) -> None:
        self._tat: dict[str, float] = {}

    async def take(self, limits: Sequence[Limit], cost: float, *, reject: bool) -> tuple[float, int]:
        now = time.monotonic()
        new_tats = [max(self._tat.get(limit.key, now), now) + WINDOW / limit.per_minute * cost
                    for limit in limits]
        if reject:
            wait, worst = max((tat - WINDOW - now, i) for i, tat in enumerate(new_tats))
            if wait > 1e-9:
                return wait, worst
        for limit, tat in zip(limits, new_tats, strict=True):
            self._tat[limit.key] = tat
        if len(self._tat) > 200_000:
            self._tat = {k: v for k, v in self._tat.items() if v > now}
        return 0.0, -1


# All buckets or none: every bucket is read first, and only when none would go over (or when
# not ``reject``) is any of them written. ARGV: cost, window, reject, then each key's interval.
_GCRA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local cost = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local reject = ARGV[3] == '1'
local new_tats = {}
local wait, worst = 0, -1
for i, key in ipairs(KEYS) do
  local tat = tonumber(redis.call('GET', key) or '0')
  if tat < now then tat = now end
  new_tats[i] = tat + tonumber(ARGV[3 + i]) * cost
  if new_tats[i] - window - now > wait then
    wait, worst = new_tats[i] - window - now, i - 1
  end
end
if reject and wait > 0.000001 then
  return {tostring(wait), worst}
end
for i, key in ipairs(KEYS) do
  redis.call('SET', key, tostring(new_tats[i]), 'PX', math.ceil((new_tats[i] - now + window) * 1000))
end
return {'0', -1}
"""


class RedisStore:
    """Counters in Redis, shared by every replica: one script call per admission, atomic."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._script = client.register_script(_GCRA)

    async def take(self, limits: Sequence[Limit], cost: float, *, reject: bool) -> tuple[float, int]:
        wait, worst = await self._script(
            keys=[f"arbiter:rl:{limit.key}" for limit in limits],
            args=[cost, WINDOW, "1" if reject else "0", *(WINDOW / limit.per_minute for limit in limits)])
        return float(wait), int(worst)


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
        """Raise RateLimited (429) when a request or token budget is spent. A request either
        spends from every bucket (one request, and one token to enter; the rest of the tokens
        when the answer says) or, refused, from none: a key over its own limit does not use
        up its project's."""
        limits = [*requests, *tokens]
        try:
            wait, worst = await self._guard(self._store.take(limits, 1.0, reject=True))
        except BackendFailed:
            if self._fail_open:
                return
            raise
        if wait > 0:
            self.limited += 1
            if self._on_limited is not None:
                self._on_limited()
            limit = limits[worst]
            what = "requests" if worst < len(requests) else "tokens"
            scope = limit.key.split(":")[0]
            raise RateLimited(f"the {scope}'s limit of {limit.per_minute} {what} per minute is spent; "
                              f"retry in {math.ceil(wait)} s", headers={"Retry-After": str(max(1, math.ceil(wait)))})

    async def charge(self, tokens: list[Limit], used: int) -> None:
        """Tokens are known after the answer: spend them (the next requests pay the debt)."""
        if used <= 1:
            return  # admit() took one already
        try:
            await self._guard(self._store.take(tokens, float(used - 1), reject=False))
        except BackendFailed:
            log.warning("could not charge %d tokens to %s: the rate-limit store is unreachable", used,
                        ", ".join(limit.key for limit in tokens))

    async def _guard(self, work: Awaitable[tuple[float, int]]) -> tuple[float, int]:
        try:
            wait, worst = await asyncio.wait_for(work, timeout=1.0)
        except Exception as exc:  # any failure of the store: unreachable, timeout, protocol
            if self.healthy:
                log.error("the rate-limit store is unreachable: %s", type(exc).__name__)
            self.healthy = False
            raise BackendFailed(503, "rate limits cannot be checked right now (Redis is unreachable); "
                                     "try again shortly", retry_after=5) from exc
        self.healthy = True
        return wait, worst

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
