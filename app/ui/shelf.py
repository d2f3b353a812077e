"""A new key's one display after Post/Redirect/Get: the POST puts the key here and redirects; the
project page takes it (once) and shows it. A reload then shows nothing and creates nothing.

An entry is tied to the session that made it and to the project, lives ``SHELF_SECONDS``, and is
never in a URL. With ``ARBITER_SECRET_KEY`` (the replicas of one deployment share it) the GET may
land on another replica: the entry is kept encrypted in Redis, or, without Redis (or with Redis
away), in a cookie of the browser's, encrypted with the same secret, which the redirect sets and
the page it leads to clears. Without a secret there is one replica: this process's memory.

A carried entry is shown once even if its cookie is sent again (copied, or replayed by the same
browser): the first display records the cookie as spent in a store every replica shares (the
database's nonce table, with an expiry past the cookie's own), and a cookie found there shows
nothing. When that store cannot be reached, nothing is shown: a key seen twice is worse than a
key to create again.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import threading
import time
from typing import Any

from cryptography.fernet import Fernet, InvalidToken
from redis.exceptions import RedisError

from app.errors import ArbiterError
from app.mesh.nonces import NonceStore
from app.ui.session import UiSession

log = logging.getLogger("arbiter.ui")
SHELF_SECONDS = 300
_PREFIX = "arbiter:ui:new-key:"
COOKIE = "arbiter_new_key"  # carries an entry when there is a secret but no Redis (see ``put``)


SPENT_SECONDS = SHELF_SECONDS + 120  # a spent cookie is remembered past its own expiry, clock skew included


class KeyShelf:
    def __init__(self, spent: NonceStore, redis: Any = None, secret: str | None = None) -> None:
        self._spent = spent  # where a carried entry's cookie is recorded at its display
        self._redis = redis if secret else None
        self._fernet = Fernet(base64.urlsafe_b64encode(
            hashlib.sha256(b"arbiter-ui-new-key:" + secret.encode()).digest())) if secret else None
        self._memory: dict[str, tuple[float, dict[str, Any]]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _slot(session: UiSession, project_id: int) -> str:
        return hashlib.sha256(f"{session.token}:{project_id}".encode()).hexdigest()

    async def put(self, session: UiSession, project_id: int, view: dict[str, Any]) -> str | None:
        """Keep ``view`` for one display. Answers the value of the cookie ``COOKIE`` to set on the
        redirect when the entry travels with the browser (a secret, but no Redis to keep it in),
        else None."""
        slot = self._slot(session, project_id)
        if self._fernet is not None:
            if self._redis is not None:
                try:
                    await self._redis.set(_PREFIX + slot, self._fernet.encrypt(json.dumps(view).encode()),
                                          ex=SHELF_SECONDS)
                    return None
                except (RedisError, OSError, TimeoutError) as exc:  # Redis away: the browser carries it
                    log.warning("web UI: cannot keep a new key in Redis (%s); sent in a sealed cookie",
                                type(exc).__name__)
            carried = json.dumps({"slot": slot, "view": view}, ensure_ascii=False, separators=(",", ":"))
            return self._fernet.encrypt(carried.encode()).decode()
        now = time.monotonic()
        with self._lock:
            for old in [k for k, (until, _) in self._memory.items() if until <= now]:
                del self._memory[old]
            self._memory[slot] = (now + SHELF_SECONDS, view)
        return None

    async def take(self, session: UiSession, project_id: int, cookie: str | None = None) -> dict[str, Any] | None:
        """The key put for this session and project, once; None when there is none (any more).
        ``cookie``: the request's ``COOKIE``, if any (the page clears it)."""
        slot = self._slot(session, project_id)
        with self._lock:
            kept = self._memory.pop(slot, None)
        if kept is not None:
            return kept[1] if kept[0] > time.monotonic() else None
        if self._fernet is None:
            return None
        if cookie:
            try:
                carried = json.loads(self._fernet.decrypt(cookie.encode(), ttl=SHELF_SECONDS))
            except (InvalidToken, ValueError):
                carried = None
            if isinstance(carried, dict) and carried.get("slot") == slot and isinstance(carried.get("view"), dict):
                return carried["view"] if await self._first_display(cookie) else None  # type: ignore[no-any-return]
        if self._redis is None:
            return None
        try:
            sealed = await self._redis.getdel(_PREFIX + slot)
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning("web UI: cannot read a new key from Redis (%s)", type(exc).__name__)
            return None
        if sealed is None:
            return None
        try:
            raw = sealed if isinstance(sealed, bytes) else str(sealed).encode()
            return json.loads(self._fernet.decrypt(raw))  # type: ignore[no-any-return]
        except (InvalidToken, ValueError):
            return None

    async def _first_display(self, cookie: str) -> bool:
        """Record a carried entry's cookie as spent; False when it was already (a replay), or when
        the store cannot say."""
        nonce = "ui:" + hashlib.sha256(cookie.encode()).hexdigest()[:29]  # the store's 32 characters
        try:
            first = await self._spent.first_use(nonce)
        except ArbiterError as exc:
            log.warning("web UI: cannot record a new key's display (%s); it is not shown", exc.message)
            return False
        if first:
            await self._spent.purge()  # now and then: a key's creation through the UI
        else:
            log.warning("web UI: a new key's cookie came back after its display; nothing shown")
        return first
