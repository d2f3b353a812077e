"""Ollama (a deployment's own, or external): /api/version, /api/tags, /api/show, /v1/systemone."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson

from infra_adapters.base import (
    BackendAuthRejected,
    BackendBroken,
    BackendProtocolError,
    CallOptions,
    RemoteModel,
    Reply,
)
from infra_adapters.http import HttpBackendBase
from infra_adapters.media import MEDIA_FIELDS, as_base64

_ROUTES = {"openai-chat": "/v1/chat/completions", "ollama-chat": "/api/chat", "embed": "/api/embed"}


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
            details = entry.get("details") or {}
            try:
                capabilities = self.capabilities(name)
            except BackendAuthRejected:
                raise  # about the service's key, not this model
            except BackendProtocolError as exc:
                # One model Ollama cannot describe (its /api/show answers 500 on a broken blob or
                # manifest, server/routes.go ShowHandler; 404 when it went away since /api/tags)
                # must not stop the others' sync: it is listed as unreadable, with why. The
                # message is without the service's URL (it may carry credentials).
                problem = str(exc).removeprefix(self.url).strip()
                models.append(RemoteModel(name=name, details=details,
                                          unreadable=f"cannot read its capabilities: {problem}"))
                continue
            models.append(RemoteModel(name=name, capabilities=capabilities, details=details))
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
        for field in MEDIA_FIELDS:
            items = body.get(field)
            if isinstance(items, list) and any(isinstance(i, str) and i.startswith("data:") for i in items):
                body[field] = [as_base64(i) if isinstance(i, str) else i for i in items]
        return body

    def route(self, api: str) -> str | None:
        return _ROUTES.get(api)

    async def pull(self, name: str, options: CallOptions) -> AsyncIterator[dict[str, Any]]:
        """Pull a model: yields Ollama's progress lines; BackendProtocolError on its error line."""
        stream = await self.open("/api/pull", {"model": name, "stream": True}, options)
        try:
            if stream.status != 200:
                body = await stream.read(1 << 20)
                raise BackendProtocolError(f"pull of {name} failed: HTTP {stream.status} {body[:300]!r}")
            pending = b""
            async for chunk in stream.chunks():
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield _progress(line, name)
            if pending.strip():
                yield _progress(pending, name)
        finally:
            await stream.close()

    def delete(self, name: str) -> bool:
        """Remove a model; False when the backend did not have it."""
        return self._admin_request("DELETE", "/api/delete", {"model": name}, missing_ok=True) is not None

    def decisions_unsupported(self, reply: Reply) -> bool:
        # Ollama's router (gin, server/routes.go) answers an unknown route with a plain-text 404
        # ("404 page not found", text/plain); a missing model is a JSON 404. Only the first means
        # "no decisions here". gin's 405 (HandleMethodNotAllowed) is only for a path another method
        # has, and no Ollama serves /v1/systemone with another method: a downgraded one is a 404.
        return reply.status == 404 and (reply.content_type or "").startswith("text/plain")


def _progress(line: bytes, name: str) -> dict[str, Any]:
    try:
        progress = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise BackendBroken(f"pull of {name}: the progress stream is not NDJSON") from exc
    if not isinstance(progress, dict):
        raise BackendBroken(f"pull of {name}: the progress stream is not NDJSON")
    if "error" in progress:
        raise BackendProtocolError(f"pull of {name} failed: {progress['error']}")
    return progress


class OllamaCloudBackend(OllamaBackend):
    """Ollama Cloud (https://ollama.com): Ollama's API behind a bearer key; it hosts, it does not pull."""

    kind = "ollama-cloud"
    DEFAULT_URL = "https://ollama.com"


def public_name(backend_name: str) -> str:
    """Ollama treats "nimble" and "nimble:latest" as one model; tenants send the short form."""
    return backend_name.removesuffix(":latest")
