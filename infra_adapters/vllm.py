"""vLLM: /version, /v1/models, /v1/systemone (and its error shape)."""

from __future__ import annotations

import hashlib
from typing import Any

from infra_adapters.base import BackendProtocolError, CallOptions, RemoteModel, Reply
from infra_adapters.http import HttpBackendBase
from infra_adapters.media import as_data_url

# A generation model on vLLM answers both chat and decisions.
GENERATION_CAPABILITIES = frozenset({"completion", "decision"})
_MEDIA = ("images", "audio", "videos")
_FASTAPI_NOT_FOUND = b'{"detail":"Not Found"}'
_ROUTES = {"openai-chat": "/v1/chat/completions", "embed": "/v1/embeddings"}


class VllmBackend(HttpBackendBase):
    kind = "vllm"

    def read_version(self) -> str | None:
        data = self._admin_get("/version")
        version = data.get("version") if isinstance(data, dict) else None
        return version if isinstance(version, str) and version else None

    def list_models(self) -> list[RemoteModel]:
        data = self._admin_get("/v1/models")
        if not isinstance(data, dict) or not isinstance(data.get("data"), list):
            raise BackendProtocolError(f"{self.url}/v1/models did not list models")
        return [
            RemoteModel(name=entry["id"], capabilities=GENERATION_CAPABILITIES,
                        details={"max_model_len": entry.get("max_model_len")})
            for entry in data["data"]
            if isinstance(entry, dict) and isinstance(entry.get("id"), str) and entry["id"]
        ]

    async def systemone(self, body: dict[str, Any], options: CallOptions) -> Reply:
        return await self._post("/v1/systemone", self.prepare(body, options.tenant_salt), options)

    @staticmethod
    def prepare(body: dict[str, Any], tenant_salt: str | None) -> dict[str, Any]:
        """vLLM's dialect: no keep_alive, media as data: URLs, a per-tenant cache salt."""
        body.pop("keep_alive", None)
        for field in _MEDIA:
            items = body.get(field)
            if isinstance(items, list):
                body[field] = [as_data_url(item) for item in items]
        if tenant_salt is not None:
            own = body.get("cache_salt")
            if isinstance(own, str) and own:
                body["cache_salt"] = hashlib.sha256(f"{tenant_salt}:{own}".encode()).hexdigest()
            else:
                body["cache_salt"] = tenant_salt
        return body

    def route(self, api: str) -> str | None:
        return _ROUTES.get(api)  # vLLM does not speak Ollama's /api/chat

    def decisions_unsupported(self, reply: Reply) -> bool:
        # A vLLM that predates /v1/systemone answers FastAPI's route 404.
        return reply.status == 404 and reply.body.strip() == _FASTAPI_NOT_FOUND
