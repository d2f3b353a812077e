"""Ollama (a deployment's own, or external): /api/version, /api/tags, /api/show, /v1/systemone."""

from __future__ import annotations

import asyncio
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

# How many /api/show calls one listing makes at once (list_models).
SHOW_CALLS = 4
_ROUTES = {"openai-chat": "/v1/chat/completions", "ollama-chat": "/api/chat", "embed": "/api/embed"}


class OllamaBackend(HttpBackendBase):
    kind = "ollama"

    async def read_version(self) -> str | None:
        data = await self._admin_get("/api/version")
        version = data.get("version") if isinstance(data, dict) else None
        return version if isinstance(version, str) and version else None

    async def list_models(self) -> list[RemoteModel]:
        """The models of /api/tags, in its order, each with the capabilities /api/show gives it.

        One /api/show per model, up to SHOW_CALLS at once: a sync of an Ollama across a network
        (Ollama Cloud) made them one after another, a round trip each. Ollama answers them side by
        side: Go's net/http serves each connection on its own goroutine, and ShowHandler
        (server/routes.go) only reads the model's manifest and metadata (GetModelInfo), without
        the scheduler. Few at once, so a sync never floods a small server nor takes much of the
        shared pool of admin connections (infra_adapters/admin.py). A failure that is not about
        one model (unreachable, a timeout, a refused key) stops the listing and cancels the calls
        still under way, as the first failed call stopped them when they ran in turn."""
        data = await self._admin_get("/api/tags")
        if not isinstance(data, dict) or not isinstance(data.get("models"), list):
            raise BackendProtocolError(f"{self.shown_url}/api/tags did not list models")
        listed: list[tuple[str, dict[str, Any]]] = []
        for entry in data["models"]:
            name = entry.get("name") or entry.get("model") if isinstance(entry, dict) else None
            if isinstance(name, str) and name:
                listed.append((name, entry.get("details") or {}))
        calls = asyncio.Semaphore(SHOW_CALLS)
        tasks = [asyncio.ensure_future(self._described(name, details, calls)) for name, details in listed]
        if not tasks:
            return []
        # Not a TaskGroup: on Python 3.11 one that is cancelling its children after a failure can
        # swallow a cancel of its own task arriving meanwhile (the shutdown's), and never undoes
        # the cancel it sends that task. Here a cancel of the listing cancels the calls and is raised.
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            for task in tasks:
                task.cancel()  # those still under way: the listing failed, or was cancelled
            await asyncio.gather(*tasks, return_exceptions=True)
        for task in tasks:  # the first failure in /api/tags order, not in time, raised as it came
            failure = None if task.cancelled() else task.exception()
            if failure is not None:
                raise failure
        return [task.result() for task in tasks]

    async def _described(self, name: str, details: dict[str, Any], calls: asyncio.Semaphore) -> RemoteModel:
        try:
            async with calls:
                capabilities = await self.capabilities(name)
        except BackendAuthRejected:
            raise  # about the service's key, not this model
        except BackendProtocolError as exc:
            # One model Ollama cannot describe (its /api/show answers 500 on a broken blob or
            # manifest, server/routes.go ShowHandler; 404 when it went away since /api/tags)
            # must not stop the others' sync: it is listed as unreadable, with why. The
            # message is without the service's URL (it may carry credentials).
            problem = str(exc).removeprefix(self.shown_url).strip()
            return RemoteModel(name=name, details=details, unreadable=f"cannot read its capabilities: {problem}")
        return RemoteModel(name=name, capabilities=capabilities, details=details)

    async def capabilities(self, name: str) -> frozenset[str]:
        data = await self._admin_post("/api/show", {"model": name})
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

    async def delete(self, name: str) -> bool:
        """Remove a model; False when the backend did not have it."""
        return await self._admin_request("DELETE", "/api/delete", {"model": name}, missing_ok=True) is not None

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
