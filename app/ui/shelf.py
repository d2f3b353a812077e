"""A new key's one display after Post/Redirect/Get: the POST puts the key here and redirects; the
project page takes it (once) and shows it. A reload then shows nothing and creates nothing.

An entry is tied to the session that made it and to the project, lives ``SHELF_SECONDS``, and is
never in a URL. With Redis and ``ARBITER_SECRET_KEY`` (the replicas of one deployment) it is kept
in Redis, encrypted, so the GET may land on another replica; otherwise in this process's memory.
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

from app.ui.session import UiSession

log = logging.getLogger("arbiter.ui")
SHELF_SECONDS = 300
_PREFIX = "arbiter:ui:new-key:"


class KeyShelf:
    def __init__(self, redis: Any = None, secret: str | None = None) -> None:
        self._redis = redis if secret else None
        self._fernet = Fernet(base64.urlsafe_b64encode(
            hashlib.sha256(b"arbiter-ui-new-key:" + secret.encode()).digest())) if secret else None
        self._memory: dict[str, tuple[float, dict[str, Any]]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _slot(session: UiSession, project_id: int) -> str:
        return hashlib.sha256(f"{session.token}:{project_id}".encode()).hexdigest()

    async def put(self, session: UiSession, project_id: int, view: dict[str, Any]) -> None:
        slot = self._slot(session, project_id)
        if self._redis is not None and self._fernet is not None:
            sealed = self._fernet.encrypt(json.dumps(view).encode())
            try:
                await self._redis.set(_PREFIX + slot, sealed, ex=SHELF_SECONDS)
                return
            except (RedisError, OSError, TimeoutError) as exc:  # Redis away: this replica's memory will do
                log.warning("web UI: cannot keep a new key in Redis (%s); kept in memory", type(exc).__name__)
        now = time.monotonic()
        with self._lock:
            for old in [k for k, (until, _) in self._memory.items() if until <= now]:
                del self._memory[old]
            self._memory[slot] = (now + SHELF_SECONDS, view)

    async def take(self, session: UiSession, project_id: int) -> dict[str, Any] | None:
        """The key put for this session and project, once; None when there is none (any more)."""
        slot = self._slot(session, project_id)
        with self._lock:
            kept = self._memory.pop(slot, None)
        if kept is not None:
            return kept[1] if kept[0] > time.monotonic() else None
        if self._redis is None or self._fernet is None:
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
