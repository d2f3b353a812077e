"""Where a node records the nonces of the signed mesh requests it accepted, so that each is
accepted once: by every process of the node (its replicas share the store, SPEC §7) and across
restarts. In Redis when ARBITER_REDIS_URL is set (``SET key 1 NX EX``: one round trip), else in
the database (the ``mesh_nonces`` table: a unique nonce and an expiry; expired rows are purged by
the mesh's sweep). A store that cannot be reached refuses the request with 503 rather than let a
replay through.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import Any, Protocol

from redis.exceptions import RedisError
from sqlalchemy import delete
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from app.db.models import MeshNonce, utcnow
from app.db.session import Database
from app.errors import BackendFailed

log = logging.getLogger("arbiter.mesh")
REDIS_PREFIX = "arbiter:mesh-nonce:"


class NonceStore(Protocol):
    async def first_use(self, nonce: str) -> bool:
        """Record ``nonce``; False when it is already recorded (a replay). BackendFailed (503)
        when the store cannot be reached."""

    async def purge(self) -> None:
        """Forget nonces whose lifetime is over."""


class RedisNonces:
    """Nonces in Redis, shared by every replica; Redis expires them itself."""

    def __init__(self, client: Any, lifetime: int) -> None:
        self._client = client
        self._lifetime = lifetime

    async def first_use(self, nonce: str) -> bool:
        try:
            created = await asyncio.wait_for(
                self._client.set(REDIS_PREFIX + nonce, 1, nx=True, ex=self._lifetime), timeout=1.0)
        except (RedisError, OSError, TimeoutError) as exc:
            log.error("the mesh nonce store (Redis) is unreachable: %s", type(exc).__name__)
            raise _unavailable() from exc
        return bool(created)

    async def purge(self) -> None:
        return None  # every key carries its expiry


class DatabaseNonces:
    """Nonces in the database, shared by every replica that uses it."""

    def __init__(self, database: Database, lifetime: int) -> None:
        self._database = database
        self._lifetime = dt.timedelta(seconds=lifetime)

    async def first_use(self, nonce: str) -> bool:
        return await asyncio.to_thread(self._insert, nonce)

    def _insert(self, nonce: str) -> bool:
        try:
            with self._database.session() as session:
                session.add(MeshNonce(nonce=nonce, expires_at=utcnow() + self._lifetime))
        except IntegrityError:  # the nonce is there: this request was accepted before
            return False
        except SQLAlchemyError as exc:
            log.error("the mesh nonce store (the database) is unreachable: %s", type(exc).__name__)
            raise _unavailable() from exc
        return True

    async def purge(self) -> None:
        await asyncio.to_thread(self._delete_expired)

    def _delete_expired(self) -> None:
        try:
            with self._database.session() as session:
                session.execute(delete(MeshNonce).where(MeshNonce.expires_at < utcnow()))
        except SQLAlchemyError as exc:  # the next sweep tries again
            log.warning("could not purge expired mesh nonces: %s", type(exc).__name__)


def nonce_store(redis: Any | None, database: Database, lifetime: int) -> NonceStore:
    return RedisNonces(redis, lifetime) if redis is not None else DatabaseNonces(database, lifetime)


def _unavailable() -> BackendFailed:
    return BackendFailed(503, "mesh credentials cannot be checked right now (the nonce store is "
                              "unreachable); try again shortly", retry_after=1)
