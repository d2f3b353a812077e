"""Rate limits per project and per key: requests and tokens per minute (SPEC §3, issue 7).

The algorithm is GCRA (a token bucket kept as one timestamp): a limit of N per minute lets
N through at once and then one every 60/N seconds. Counters live in this process, or in
Redis (ARBITER_REDIS_URL) so a limit holds across every replica; the Redis update is one
Lua script, atomic, on Redis's own clock. A request spends from all its buckets (project's
and key's) or, refused, from none.

While Redis cannot be reached, each replica counts a share of every limit in its own memory
(the limit divided by the replicas counted, app/tenancy/replicas.py), unless
ARBITER_RATE_LIMIT_FALLBACK says to let requests through (open) or refuse them (closed). Once
Redis answers again, each replica adds what it spent meanwhile to the shared buckets before
any request is counted there: a Redis that came back empty does not hand out a fresh minute's
burst on top of the outage's spending.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
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

    def debts(self) -> dict[str, float]:
        """Each bucket still spent: seconds until it is whole again (its TAT less now)."""
        now = time.monotonic()
        return {key: tat - now for key, tat in self._tat.items() if tat > now}

    def clear(self) -> None:
        self._tat.clear()


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


# What one replica spent while Redis was away, added to the shared buckets: each bucket's TAT
# (or now, when it is older or gone) moves on by the debt. ARGV: window, then each key's debt.
_ADD_DEBTS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local window = tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
  local tat = tonumber(redis.call('GET', key) or '0')
  if tat < now then tat = now end
  tat = tat + tonumber(ARGV[1 + i])
  redis.call('SET', key, tostring(tat), 'PX', math.ceil((tat - now + window) * 1000))
end
return #KEYS
"""
DEBTS_PER_CALL = 500  # keys per script call: a long outage may leave many buckets spent


class RedisStore:
    """Counters in Redis, shared by every replica: one script call per admission, atomic."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._script = client.register_script(_GCRA)
        self._add = client.register_script(_ADD_DEBTS)

    async def ping(self) -> None:
        await self._client.ping()

    async def add_debts(self, debts: dict[str, float]) -> None:
        """Add ``debts`` (seconds, each key's shared scale) to the shared buckets."""
        items = list(debts.items())
        for start in range(0, len(items), DEBTS_PER_CALL):
            chunk = items[start:start + DEBTS_PER_CALL]
            await self._add(keys=[f"arbiter:rl:{key}" for key, _ in chunk],
                            args=[WINDOW, *(debt for _, debt in chunk)])

    async def take(self, limits: Sequence[Limit], cost: float, *, reject: bool) -> tuple[float, int]:
        wait, worst = await self._script(
            keys=[f"arbiter:rl:{limit.key}" for limit in limits],
            args=[cost, WINDOW, "1" if reject else "0", *(WINDOW / limit.per_minute for limit in limits)])
        return float(wait), int(worst)


FALLBACKS = ("share", "open", "closed")
PROBE_INTERVAL = 1.0  # seconds between looks at a Redis that is away, while counting shares


class RateLimiter:
    """Admits requests and charges tokens; reports whether its store is reachable.

    ``fallback`` is what a shared store (Redis) that does not answer leads to: ``share`` (count
    a share of each limit here, ``limit // replicas()``), ``open`` (let requests through) or
    ``closed`` (refuse them with 503)."""

    def __init__(self, store: Store, *, shared: bool, fallback: str = "share", on_limited: Any = None,
                 replicas: Callable[[], int] = lambda: 1) -> None:
        if fallback not in FALLBACKS:
            raise ValueError(f"fallback must be one of {', '.join(FALLBACKS)}")
        self._on_limited = on_limited
        self._store = store
        self._fallback = fallback
        self._replicas = replicas
        self.shared = shared
        self.healthy = True
        self.limited = 0  # requests refused with 429, for the metric
        # Counting shares: Redis is away and fallback is "share". Left only by recover(), which
        # hands what was spent here to Redis first; requests that come meanwhile wait for it.
        self.sharing = False
        self._local = LocalStore()
        self._ratios: dict[str, float] = {}  # bucket -> its share over its limit, for the hand-back
        self._handing_back: asyncio.Future[None] | None = None

    @property
    def mode(self) -> str:
        """How limits are counted now: ``shared`` (Redis, or this process alone without it),
        ``local_share``, or with Redis unreachable and no share, ``open`` or ``closed``."""
        if self.sharing:
            return "local_share"
        return "shared" if self.healthy or not self.shared else self._fallback

    def replicas(self) -> int:
        return max(1, self._replicas())

    async def admit(self, requests: list[Limit], tokens: list[Limit]) -> None:
        """Raise RateLimited (429) when a request or token budget is spent. A request either
        spends from every bucket (one request, and one token to enter; the rest of the tokens
        when the answer says) or, refused, from none: a key over its own limit does not use
        up its project's."""
        limits = [*requests, *tokens]
        if self._handing_back is not None:
            await asyncio.shield(self._handing_back)
        if self.sharing:
            wait, worst = await self._take_share(limits, 1.0, reject=True)
        else:
            try:
                wait, worst = await self._guard(self._store.take(limits, 1.0, reject=True))
            except BackendFailed:
                if self._fallback == "open":
                    return
                if self._fallback == "closed":
                    raise
                self._begin_sharing()
                wait, worst = await self._take_share(limits, 1.0, reject=True)
        if wait > 0:
            self.limited += 1
            if self._on_limited is not None:
                self._on_limited()
            limit = limits[worst]
            what = "requests" if worst < len(requests) else "tokens"
            scope = limit.key.split(":")[0]
            share = (f" (this replica's share while Redis is unreachable: {self._share(limit).per_minute})"
                     if self.sharing else "")
            raise RateLimited(f"the {scope}'s limit of {limit.per_minute} {what} per minute is spent{share}; "
                              f"retry in {math.ceil(wait)} s", headers={"Retry-After": str(max(1, math.ceil(wait)))})

    async def charge(self, tokens: list[Limit], used: int) -> None:
        """Tokens are known after the answer: spend them (the next requests pay the debt)."""
        if used <= 1:
            return  # admit() took one already
        if self._handing_back is not None:
            await asyncio.shield(self._handing_back)
        if self.sharing:
            await self._take_share(tokens, float(used - 1), reject=False)
            return
        try:
            await self._guard(self._store.take(tokens, float(used - 1), reject=False))
        except BackendFailed:
            log.warning("could not charge %d tokens to %s: the rate-limit store is unreachable", used,
                        ", ".join(limit.key for limit in tokens))

    def _share(self, limit: Limit) -> Limit:
        return Limit(limit.key, max(1, limit.per_minute // self.replicas()))

    async def _take_share(self, limits: Sequence[Limit], cost: float, *, reject: bool) -> tuple[float, int]:
        shares = [self._share(limit) for limit in limits]
        for limit, share in zip(limits, shares, strict=True):
            self._ratios[limit.key] = share.per_minute / limit.per_minute
        return await self._local.take(shares, cost, reject=reject)

    def _begin_sharing(self) -> None:
        if not self.sharing:
            self.sharing = True
            log.warning("rate limits: Redis is unreachable; counting 1/%d of each limit in this replica until "
                        "it answers", self.replicas())

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
        """For /readyz and the probe: can the store be reached? Reached while counting shares,
        what was spent here goes to Redis first (recover)."""
        if isinstance(self._store, RedisStore):
            try:
                await asyncio.wait_for(self._store.ping(), timeout=1.0)
                self.healthy = True
            except (RedisError, OSError, TimeoutError):
                self.healthy = False
                if self._fallback == "share":
                    self._begin_sharing()
            if self.healthy and self.sharing:
                await self.recover()
        return self.healthy

    async def recover(self) -> None:
        """Back to Redis: add what this replica spent from its shares to the shared buckets (in
        the shared scale: a share's debt times its share of the limit), then count there again.
        Requests that arrive meanwhile wait for it; should Redis fail again, shares go on."""
        if self._handing_back is not None:
            await asyncio.shield(self._handing_back)
            return
        store = self._store
        if not isinstance(store, RedisStore):  # shares are only ever counted for Redis
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._handing_back = done
        debts = {key: debt * self._ratios.get(key, 1.0) for key, debt in self._local.debts().items()}
        try:
            await asyncio.wait_for(store.add_debts(debts), timeout=5.0)
        except (RedisError, OSError, TimeoutError) as exc:
            self.healthy = False
            log.warning("rate limits: Redis answered, but taking this replica's spending failed (%s); "
                        "still counting shares", type(exc).__name__)
        else:
            self.sharing = False
            self._local.clear()
            self._ratios.clear()
            log.info("rate limits: Redis is back; %d buckets spent during the outage added to it", len(debts))
        finally:
            self._handing_back = None
            done.set_result(None)

    async def run(self) -> None:
        """While shares are counted, look for Redis every PROBE_INTERVAL (requests do not: a
        Redis that times out would cost each of them a second)."""
        while True:
            await asyncio.sleep(PROBE_INTERVAL)
            if self.sharing:
                try:
                    await self.ping()
                except Exception:  # the probe must outlive any surprise, or shares would never end
                    log.exception("rate limits: looking for Redis failed")


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
