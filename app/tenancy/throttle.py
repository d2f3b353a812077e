"""Failed credentials per client address: after ``limit`` failures within ``window`` seconds,
that address is refused (429 with Retry-After) until the window ends, before any key is looked
up. Covers web UI sign-ins and admin keys (app/api/throttle.py); project keys are not counted
(the decision path pays nothing for it; docs/admin.md says why).

A window starts at an address's first failure and is not reset by a success: a caller holding
one valid key cannot wipe its count of guesses by using it between them. One address's failures
never touch another's. IPv6 addresses count per /64, which one host can hold whole.

The counts live in Redis when ARBITER_REDIS_URL is set (one count for every replica), else in
this process, for at most ``MAX_ADDRESSES`` addresses (the least recently failing go first). A
Redis that does not answer lets attempts through (with a log line): a lock-out of every admin is
worse than the guessing it slows down, since a key is 256 random bits.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
import time
from collections import OrderedDict
from typing import Any, Protocol

from redis.exceptions import RedisError

log = logging.getLogger("arbiter.throttle")
MAX_ADDRESSES = 10_000
STORE_TIMEOUT = 1.0  # seconds a Redis call may take before the attempt is let through


def client_key(host: str | None) -> str:
    """What failures are counted by: the address, an IPv6 one cut to its /64."""
    if not host:
        return "unknown"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host[:100]
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


class Failures(Protocol):
    async def wait(self, client: str, limit: int) -> float:
        """Seconds until ``client`` may try again (0: now)."""

    async def add(self, client: str, window: float) -> None:
        """Count one failure of ``client``."""


class LocalFailures:
    """Counts of this process: (end of the window, failures in it) per client, least recent first."""

    def __init__(self, max_clients: int = MAX_ADDRESSES) -> None:
        self._max = max_clients
        self._counts: OrderedDict[str, tuple[float, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._counts)

    async def wait(self, client: str, limit: int) -> float:
        entry = self._counts.get(client)
        now = time.monotonic()
        if entry is None or entry[0] <= now or entry[1] < limit:
            return 0.0
        return entry[0] - now

    async def add(self, client: str, window: float) -> None:
        now = time.monotonic()
        end, count = self._counts.pop(client, (0.0, 0))
        self._counts[client] = (end, count + 1) if end > now else (now + window, 1)
        while len(self._counts) > self._max:
            self._counts.popitem(last=False)


# One failure: the count goes up, and the first one of a window sets when the window ends.
_ADD = """
local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return n
"""


class RedisFailures:
    """Counts in Redis, shared by every replica; each expires with its window."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._add = client.register_script(_ADD)

    async def wait(self, client: str, limit: int) -> float:
        async with self._client.pipeline(transaction=False) as pipe:
            count, ttl = await pipe.get(_key(client)).pttl(_key(client)).execute()
        if count is None or int(count) < limit or ttl <= 0:
            return 0.0
        return float(ttl) / 1000

    async def add(self, client: str, window: float) -> None:
        await self._add(keys=[_key(client)], args=[max(1, int(window * 1000))])


def _key(client: str) -> str:
    return f"arbiter:authfail:{client}"


class FailureThrottle:
    """The throttle the sign-in form and the admin routes share."""

    def __init__(self, failures: Failures, *, limit: int, window: float) -> None:
        self._failures = failures
        self.limit = limit
        self.window = window
        self._store_down = False

    @property
    def on(self) -> bool:
        return self.limit > 0

    async def retry_after(self, client: str) -> int:
        """Whole seconds until ``client`` may try again; 0 when it may now."""
        if not self.on:
            return 0
        wait = await self._guard(self._failures.wait(client, self.limit), 0.0)
        return max(1, math.ceil(wait)) if wait > 0 else 0

    async def failed(self, client: str) -> None:
        if self.on:
            await self._guard(self._failures.add(client, self.window), None)

    async def _guard(self, work: Any, fallback: Any) -> Any:
        try:
            answer = await asyncio.wait_for(work, STORE_TIMEOUT)
        except (RedisError, OSError, TimeoutError) as exc:  # the attempt goes through, said once
            if not self._store_down:
                log.error("failed sign-ins cannot be counted (Redis is unreachable: %s); not throttling",
                          type(exc).__name__)
            self._store_down = True
            return fallback
        self._store_down = False
        return answer


def retry_message(seconds: int) -> str:
    return f"too many failed keys from this address; try again in {seconds} s"
