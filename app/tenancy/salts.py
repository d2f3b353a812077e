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
        """A forwarded mesh request keeps the salt its entry node gave the caller's project."""
        return principal.mesh_salt or self.of(principal.project_id)
