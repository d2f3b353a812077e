"""The key cache: digest -> Principal, so a decision needs no database round trip.

Entries live ``ttl`` seconds (unknown keys ``NEGATIVE_TTL``); a revocation, rotation, new
key or project change drops them at once, here and (through the change bus) on every
replica. A miss goes to the database in a worker thread.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable

from sqlalchemy.exc import SQLAlchemyError

from app.errors import AuthenticationFailed, BackendFailed
from app.tenancy.keys import KeyHasher, bearer_token, kind_of
from app.tenancy.principal import Principal

Loader = Callable[[str], "Principal | None"]
_MAX_ENTRIES = 100_000
NEGATIVE_TTL = 2.0  # an unknown key is remembered briefly, so a flood of bogus keys is cheap
LOOKUP_TIMEOUT = 5.0  # seconds a key lookup may take before the request is refused (503)
log = logging.getLogger("arbiter.keys")


class KeyCache:
    def __init__(self, hasher: KeyHasher, loader: Loader, ttl: float) -> None:
        self._hasher = hasher
        self._loader = loader
        self._ttl = ttl
        self._entries: dict[str, tuple[float, Principal | None]] = {}
        self._loading: dict[str, asyncio.Future[Principal | None]] = {}
        self._generation = 0
        self._changed: asyncio.Event | None = None  # set at the next invalidate(), for running streams

    async def authenticate(self, authorization: str | None, kind: str) -> Principal:
        """The principal of a request's Authorization header, or AuthenticationFailed."""
        token = bearer_token(authorization)
        if token is None:
            raise AuthenticationFailed(
                "missing API key: send it as 'Authorization: Bearer <key>'"
            )
        token_kind = kind_of(token)
        if token_kind is None:
            raise AuthenticationFailed("invalid API key")
        if token_kind != kind:
            if kind == "admin":
                raise AuthenticationFailed("this route needs an admin key; project keys cannot open it")
            raise AuthenticationFailed("admin keys cannot call models; use a project key")
        digest = self._hasher.digest(token)
        principal = await self._resolve(digest)
        if principal is None or principal.kind != kind:
            raise AuthenticationFailed("invalid API key")
        if not principal.usable(dt.datetime.now(dt.UTC)):
            raise AuthenticationFailed("this API key is revoked or expired")
        return principal

    async def _resolve(self, digest: str) -> Principal | None:
        entry = self._entries.get(digest)
        now = time.monotonic()
        if entry is not None and entry[0] > now:
            return entry[1]
        pending = self._loading.get(digest)
        if pending is not None:  # the same key is being looked up already: share the answer
            return await asyncio.shield(pending)
        future: asyncio.Future[Principal | None] = asyncio.get_running_loop().create_future()
        self._loading[digest] = future
        generation = self._generation
        try:
            principal = await asyncio.wait_for(asyncio.to_thread(self._loader, digest), LOOKUP_TIMEOUT)
        except (SQLAlchemyError, TimeoutError) as exc:
            log.error("cannot look up an API key: the database is unavailable (%s)", type(exc).__name__)
            error = BackendFailed(503, "cannot verify the API key right now; try again shortly",
                                  retry_after=5)
            _fail(future, error)
            raise error from exc
        except BaseException as exc:  # whatever it is, no one waiting on this lookup may hang
            _fail(future, exc)
            raise
        finally:
            if self._loading.get(digest) is future:  # not a later lookup, started after an invalidate()
                del self._loading[digest]
        future.set_result(principal)
        # A change (a revocation) made while this lookup ran may not be in what it read: do not
        # cache an answer older than the latest invalidation.
        if generation == self._generation:
            if len(self._entries) >= _MAX_ENTRIES:
                self._entries.clear()
            ttl = self._ttl if principal is not None else min(self._ttl, NEGATIVE_TTL)
            self._entries[digest] = (now + ttl, principal)
        return principal

    def invalidate(self) -> None:
        """Drop every entry (a key or project changed). Lookups in flight may have read the row
        before the change: requests from now on do not join them but look up again."""
        self._generation += 1
        self._entries.clear()
        self._loading.clear()
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def changed(self, within: float) -> None:
        """Return at the next invalidate() (a key or project changed, here or, through the change
        bus, on another replica), or after ``within`` seconds, whichever comes first: a running
        stream looks at its key again then (``authenticate``: in memory, unless that key's entry
        was dropped or is stale)."""
        if self._changed is None:
            self._changed = asyncio.Event()
        try:
            await asyncio.wait_for(self._changed.wait(), within)
        except TimeoutError:
            pass


def _fail(future: asyncio.Future[Principal | None], error: BaseException) -> None:
    future.set_exception(error)
    future.exception()  # retrieved: no "never retrieved" warning when nobody waits
