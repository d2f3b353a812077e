"""The key cache: digest -> Principal, so a decision needs no database round trip.

Entries live ``ttl`` seconds; a revocation, rotation or project change in this
process drops them at once. A miss goes to the database in a worker thread.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Callable

from app.errors import AuthenticationFailed
from app.tenancy.keys import KeyHasher, bearer_token, kind_of
from app.tenancy.principal import Principal

Loader = Callable[[str], "Principal | None"]
_MAX_ENTRIES = 100_000


class KeyCache:
    def __init__(self, hasher: KeyHasher, loader: Loader, ttl: float) -> None:
        self._hasher = hasher
        self._loader = loader
        self._ttl = ttl
        self._entries: dict[str, tuple[float, Principal | None]] = {}

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
        principal = await asyncio.to_thread(self._loader, digest)
        if principal is not None:
            if len(self._entries) >= _MAX_ENTRIES:
                self._entries.clear()
            self._entries[digest] = (now + self._ttl, principal)
        return principal

    def invalidate(self) -> None:
        """Drop every entry (a key or project changed)."""
        self._entries.clear()
