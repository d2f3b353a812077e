"""The per-project prefix-cache salt sent to vLLM (SPEC §1): one tenant cannot time another's
prompts through a shared prefix cache. A caller's own salt is combined with it, never trusted."""

from __future__ import annotations

import hashlib
import hmac

from app.settings import Settings
from app.tenancy.principal import Principal


class TenantSalts:
    def __init__(self, settings: Settings) -> None:
        secret = next((s.get_secret_value() for s in (settings.secret_key, settings.key_pepper) if s), "")
        self._key = hashlib.sha256(b"arbiter-cache-salt:" + secret.encode()).digest()
        self._cache: dict[int | None, str] = {}

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
