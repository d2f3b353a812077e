"""vLLM: /version, /v1/models, /v1/systemone (and its error shape); /v1/decisions is forwarded as is."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

from infra_adapters.base import BackendProtocolError, CallOptions, RemoteModel, Reply
from infra_adapters.http import HttpBackendBase
from infra_adapters.media import MEDIA_FIELDS, as_data_url

# A generation model on vLLM answers both chat and decisions.
GENERATION_CAPABILITIES = frozenset({"completion", "decision"})
_FASTAPI_NOT_FOUND = b'{"detail":"Not Found"}'
# "openai-decisions": vLLM serves OpenAI's Decisions API itself (for its generation models).
_ROUTES = {"openai-chat": "/v1/chat/completions", "embed": "/v1/embeddings",
           "openai-decisions": "/v1/decisions"}


class VllmBackend(HttpBackendBase):
    kind = "vllm"

    async def read_version(self) -> str | None:
        data = await self._admin_get("/version")
        version = data.get("version") if isinstance(data, dict) else None
        return version if isinstance(version, str) and version else None

    async def list_models(self) -> list[RemoteModel]:
        data = await self._admin_get("/v1/models")
        if not isinstance(data, dict) or not isinstance(data.get("data"), list):
            raise BackendProtocolError(f"{self.shown_url}/v1/models did not list models")
        return [
            RemoteModel(name=entry["id"], capabilities=GENERATION_CAPABILITIES,
                        details={"max_model_len": entry.get("max_model_len")})
            for entry in data["data"]
            if isinstance(entry, dict) and isinstance(entry.get("id"), str) and entry["id"]
        ]

    async def systemone(self, body: dict[str, Any], options: CallOptions) -> Reply:
        prepared = self.prepare(body, options.tenant_salt)
        return await self._post("/v1/systemone", prepared, dataclasses.replace(options, tenant_salt=None))

    @staticmethod
    def prepare(body: dict[str, Any], tenant_salt: str | None) -> dict[str, Any]:
        """vLLM's dialect: no keep_alive, media as data: URLs, a per-tenant cache salt."""
        body.pop("keep_alive", None)
        for field in MEDIA_FIELDS:
            items = body.get(field)
            if isinstance(items, list):
                body[field] = [as_data_url(item) for item in items]
        return salted(body, tenant_salt)

    async def open(self, path: str, body: dict[str, Any], options: CallOptions) -> Any:
        """Chat shares vLLM's prefix cache as decisions do: it carries the tenant's salt too."""
        if options.tenant_salt is not None and path == _ROUTES["openai-chat"]:
            body = salted(dict(body), options.tenant_salt)
        return await super().open(path, body, options)

    def route(self, api: str) -> str | None:
        return _ROUTES.get(api)  # vLLM does not speak Ollama's /api/chat

    def decisions_unsupported(self, reply: Reply) -> bool:
        # A vLLM that predates /v1/systemone answers FastAPI's route 404.
        return reply.status == 404 and reply.body.strip() == _FASTAPI_NOT_FOUND


def salted(body: dict[str, Any], tenant_salt: str | None) -> dict[str, Any]:
    """``cache_salt`` set to the tenant's salt, combined with the caller's own if it sent one."""
    if tenant_salt is None:
        return body
    own = body.get("cache_salt")
    if isinstance(own, str) and own and own != tenant_salt:
        body["cache_salt"] = hashlib.sha256(f"{tenant_salt}:{own}".encode()).hexdigest()
    else:
        body["cache_salt"] = tenant_salt
    return body
