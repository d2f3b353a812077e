"""The key cache: digest -> Principal, so a decision needs no database round trip.

Entries live ``ttl`` seconds (unknown keys ``NEGATIVE_TTL``); a revocation, rotation, new
key or project change drops them at once, here and (through the change bus) on every
replica. A miss goes to the database in a worker thread.

A key the database said was valid within ``stale`` seconds (ARBITER_KEY_STALE_SECONDS) keeps
working while the database cannot be reached: once a lookup has failed for the database's sake
(refused, timed out, cut), such a key is served from memory at once and re-read in the
background, at most once per ``AWAY_RETRY`` seconds, until the database answers again. What the
database answered is never overridden: a key it said was revoked or unknown stays refused, and
an expiry time is checked on the cached principal as on a fresh one. A key not verified within
the window gets 503 (cannot verify), never 401.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable

from sqlalchemy.exc import SQLAlchemyError

from app.db.session import UNREACHABLE
from app.errors import AuthenticationFailed, BackendFailed
from app.tenancy.keys import KeyHasher, bearer_token, kind_of
from app.tenancy.principal import Principal

Loader = Callable[[str], "Principal | None"]
# (fresh until, principal or None for an unknown key, usable while the database is away until):
# a tuple, indexed on the hot path.
_Entry = tuple[float, "Principal | None", float]
_MAX_ENTRIES = 100_000
NEGATIVE_TTL = 2.0  # an unknown key is remembered briefly, so a flood of bogus keys is cheap
LOOKUP_TIMEOUT = 5.0  # seconds a key lookup may take before the request is refused (503)
AWAY_RETRY = 1.0  # while the database is away, a stale key is re-read in the background at most this often
log = logging.getLogger("arbiter.keys")


class DatabaseAway(BackendFailed):
    """The 503 of a lookup the database could not answer (not one it answered "no" to)."""

    def __init__(self) -> None:
        super().__init__(503, "cannot verify the API key right now; try again shortly", retry_after=5)


class KeyCache:
    def __init__(self, hasher: KeyHasher, loader: Loader, ttl: float, stale: float = 0.0) -> None:
        self._hasher = hasher
        self._loader = loader
        self._ttl = ttl
        self._stale = stale
        self._entries: dict[str, _Entry] = {}
        self._loading: dict[str, asyncio.Future[Principal | None]] = {}
        self._generation = 0
        self._changed: asyncio.Event | None = None  # set at the next invalidate(), for running streams
        self.away = False  # the last lookup failed for the database's sake
        self._retry_at = 0.0  # while away: no background re-read of a stale key before this
        self._refreshes: set[asyncio.Task[None]] = set()

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
        if entry is not None:
            if entry[0] > now:
                return entry[1]
            if self.away and entry[2] > now:  # verified lately, and the database is away: no wait
                if now >= self._retry_at and digest not in self._loading:
                    self._retry_at = now + AWAY_RETRY
                    self._refresh(digest)
                return entry[1]
        try:
            pending = self._loading.get(digest)
            if pending is not None:  # the same key is being looked up already: share the answer
                return await asyncio.shield(pending)
            return await self._lookup(digest)
        except DatabaseAway:
            kept = self._entries.get(digest)  # gone if a revocation came meanwhile
            if kept is not None and kept[2] > time.monotonic():
                return kept[1]
            raise

    async def _lookup(self, digest: str) -> Principal | None:
        future: asyncio.Future[Principal | None] = asyncio.get_running_loop().create_future()
        self._loading[digest] = future
        generation = self._generation
        try:
            principal = await asyncio.wait_for(asyncio.to_thread(self._loader, digest), LOOKUP_TIMEOUT)
        except UNREACHABLE as exc:
            log.error("cannot look up an API key: the database is unavailable (%s)", type(exc).__name__)
            if not self.away and self._stale > 0:
                log.warning("the database cannot be reached: keys verified in the last %d s keep working "
                            "(ARBITER_KEY_STALE_SECONDS) until it answers again; others get 503", self._stale)
            self.away = True
            self._retry_at = time.monotonic() + AWAY_RETRY
            error = DatabaseAway()
            _fail(future, error)
            raise error from exc
        except SQLAlchemyError as exc:  # the database answered, with an error: no stale key for that
            log.error("cannot look up an API key: %s", type(exc).__name__)
            failed = BackendFailed(503, "cannot verify the API key right now; try again shortly", retry_after=5)
            _fail(future, failed)
            raise failed from exc
        except BaseException as exc:  # whatever it is, no one waiting on this lookup may hang
            _fail(future, exc)
            raise
        finally:
            if self._loading.get(digest) is future:  # not a later lookup, started after an invalidate()
                del self._loading[digest]
        future.set_result(principal)
        if self.away:
            self.away = False
            log.info("the database answers key lookups again")
        # A change (a revocation) made while this lookup ran may not be in what it read: do not
        # cache an answer older than the latest invalidation.
        if generation == self._generation:
            if len(self._entries) >= _MAX_ENTRIES:
                self._entries.clear()
            now = time.monotonic()
            if principal is not None:
                self._entries[digest] = (now + self._ttl, principal, now + self._stale)
            else:
                self._entries[digest] = (now + min(self._ttl, NEGATIVE_TTL), None, 0.0)
        return principal

    def _refresh(self, digest: str) -> None:
        """Re-read a stale key in the background (the request it came with is served already)."""
        async def refresh() -> None:
            try:
                await self._lookup(digest)
            except Exception:  # noqa: BLE001, S110 - logged by _lookup; the next request tries again
                pass
        task = asyncio.get_running_loop().create_task(refresh())
        self._refreshes.add(task)
        task.add_done_callback(self._refreshes.discard)

    async def aclose(self) -> None:
        """Stop the background re-reads (at shutdown)."""
        for task in list(self._refreshes):
            task.cancel()
        await asyncio.gather(*self._refreshes, return_exceptions=True)

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

    def expire(self) -> None:
        """Have every key verified again on its next use, but keep what was verified for the time
        the database is away: a change may have been missed (the change bus was cut off), yet
        nothing says which key it was about (``invalidate`` is for the changes that are known)."""
        self._generation += 1
        self._entries = {digest: (0.0, entry[1], entry[2]) for digest, entry in self._entries.items()
                         if entry[1] is not None}
        self._loading.clear()


def _fail(future: asyncio.Future[Principal | None], error: BaseException) -> None:
    future.set_exception(error)
    future.exception()  # retrieved: no "never retrieved" warning when nobody waits
