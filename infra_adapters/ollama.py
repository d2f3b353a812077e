"""Ollama (a deployment's own, or external): /api/version, /api/tags, /api/show, /v1/systemone."""

from __future__ import annotations

from typing import Any

from infra_adapters.base import BackendProtocolError, CallOptions, RemoteModel, Reply
from infra_adapters.http import HttpBackendBase
from infra_adapters.media import as_base64

_MEDIA = ("images", "audio", "videos")


class OllamaBackend(HttpBackendBase):
    kind = "ollama"

    def read_version(self) -> str | None:
        data = self._admin_get("/api/version")
        version = data.get("version") if isinstance(data, dict) else None
        return version if isinstance(version, str) and version else None

    def list_models(self) -> list[RemoteModel]:
        data = self._admin_get("/api/tags")
        if not isinstance(data, dict) or not isinstance(data.get("models"), list):
            raise BackendProtocolError(f"{self.url}/api/tags did not list models")
        models = []
        for entry in data["models"]:
            name = entry.get("name") or entry.get("model") if isinstance(entry, dict) else None
            if not isinstance(name, str) or not name:
                continue
            models.append(RemoteModel(name=name, capabilities=self.capabilities(name),
                                      details=entry.get("details") or {}))
        return models

    def capabilities(self, name: str) -> frozenset[str]:
        data = self._admin_post("/api/show", {"model": name})
        caps = data.get("capabilities") if isinstance(data, dict) else None
        return frozenset(c for c in caps if isinstance(c, str)) if isinstance(caps, list) else frozenset()

    async def systemone(self, body: dict[str, Any], options: CallOptions) -> Reply:
        return await self._post("/v1/systemone", self.prepare(body), options)

    @staticmethod
    def prepare(body: dict[str, Any]) -> dict[str, Any]:
        """Ollama's dialect: media as plain base64 (it decodes the field, it does not fetch URLs)."""
        for field in _MEDIA:
            items = body.get(field)
            if isinstance(items, list) and any(isinstance(i, str) and i.startswith("data:") for i in items):
                body[field] = [as_base64(i) if isinstance(i, str) else i for i in items]
        return body

    def decisions_unsupported(self, reply: Reply) -> bool:
        # Ollama's router answers an unknown route with Go's plain-text 404;
        # a missing model is a JSON 404. Only the first means "no decisions here".
        return reply.status == 404 and (reply.content_type or "").startswith("text/plain")


def public_name(backend_name: str) -> str:
    """Ollama treats "nimble" and "nimble:latest" as one model; tenants send the short form."""
    return backend_name.removesuffix(":latest")
