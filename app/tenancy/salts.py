"""The per-project prefix-cache salt sent to vLLM (SPEC §1): one tenant cannot time another's
prompts through a shared prefix cache. A caller's own salt is combined with it, never trusted.

It is keyed from ARBITER_SECRET_KEY (or else ARBITER_KEY_PEPPER); without either, from a random
secret the deployment makes once and keeps in its database (``stored_secret``), read at start-up:
so project 1's salt differs from one deployment to the next, and is the same on every replica."""

from __future__ import annotations

import hashlib
import hmac
import secrets

from sqlalchemy.exc import IntegrityError

from app.db.models import DeploymentSecret
from app.db.session import Database
from app.settings import Settings
from app.tenancy.principal import Principal

SECRET_NAME = "cache-salt"


class TenantSalts:
    def __init__(self, settings: Settings) -> None:
        secret = next((s.get_secret_value() for s in (settings.secret_key, settings.key_pepper) if s), None)
        self.needs_stored_secret = secret is None  # ``adopt`` the database's at start-up
        self._key = _key_of(secret or "")
        self._cache: dict[int | None, str] = {}

    def adopt(self, stored: str) -> None:
        """Key the salts from the deployment's stored secret (when no setting gives one)."""
        if self.needs_stored_secret:
            self._key = _key_of(stored)
            self._cache = {}

    def of(self, project_id: int | None) -> str:
        salt = self._cache.get(project_id)
        if salt is None:
            salt = hmac.new(self._key, str(project_id).encode(), hashlib.sha256).hexdigest()
            if len(self._cache) < 100_000:
                self._cache[project_id] = salt
        return salt

    def of_caller(self, principal: Principal) -> str:
        """The caller's salt. A forwarded mesh request's is derived from the entry node's name and
        the salt it gave the caller's project: project ids are per database, so two nodes' project 1
        must not share a prefix cache here."""
        if principal.mesh_salt is None:
            return self.of(principal.project_id)
        message = f"mesh:{principal.key_prefix}:{principal.mesh_salt}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()


def _key_of(secret: str) -> bytes:
    return hashlib.sha256(b"arbiter-cache-salt:" + secret.encode()).digest()


def stored_secret(database: Database, name: str = SECRET_NAME) -> str:
    """The deployment's secret ``name``, made on first use. Replicas starting at once race: each
    inserts a value of its own, one insert wins, and every replica reads the winner's. Blocking:
    run it in a worker thread, once, at start-up."""
    with database.session() as session:
        row = session.get(DeploymentSecret, name)
        if row is not None:
            return row.value
    try:
        with database.session() as session:
            session.add(DeploymentSecret(name=name, value=secrets.token_urlsafe(32)))
    except IntegrityError:
        pass  # another replica's insert came first: read it
    with database.session() as session:
        row = session.get(DeploymentSecret, name)
        assert row is not None  # inserted above, here or by another replica; never deleted
        return row.value
