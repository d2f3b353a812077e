"""An OpenAI-compatible server (llama.cpp's `llama-server`, LM Studio, a vLLM without decisions):
`/v1/models` and `/v1/chat/completions`. It has no decision endpoint of its own: its models
answer decisions by label reading (first-token logprobs, ``openai_logprobs``), and chat as is."""

from __future__ import annotations

from typing import Any

from infra_adapters.base import (
    BackendAuthRejected,
    BackendProtocolError,
    CallOptions,
    RemoteModel,
    Reply,
)
from infra_adapters.http import HttpBackendBase
from infra_adapters.vllm import salted

_ROUTES = {"openai-chat": "/v1/chat/completions"}
_NO_DECISIONS = b'{"error": "an OpenAI-compatible server answers decisions by label reading only"}'


class OpenAICompatBackend(HttpBackendBase):
    """``salts_prefix_cache``: the server is a vLLM (its version was read), so chat carries the
    project's ``cache_salt`` as a ``vllm`` service's does (SPEC §1); other servers share one cache
    that no field of the request can split."""

    kind = "openai"

    def __init__(self, url: str, *, salts_prefix_cache: bool = False, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self.salts_prefix_cache = salts_prefix_cache

    async def read_version(self) -> str | None:
        """A vLLM's version, or None: OpenAI's API has no version route, but vLLM serves
        ``GET /version`` as ``{"version": "<version>"}`` (``show_version`` in its
        ``entrypoints/openai/api_server.py``). Any other answer (a 404, a refusal, another shape)
        means another server; a server that cannot be reached raises, as for any backend."""
        try:
            data = await self._admin_request("GET", "/version", missing_ok=True)
        except (BackendProtocolError, BackendAuthRejected):
            data = None
        return vllm_version(data)

    async def list_models(self) -> list[RemoteModel]:
        data = await self._admin_get("/v1/models")
        if not isinstance(data, dict) or not isinstance(data.get("data"), list):
            raise BackendProtocolError(f"{self.shown_url}/v1/models did not list models")
        return [RemoteModel(name=entry["id"], capabilities=frozenset({"completion"}))
                for entry in data["data"]
                if isinstance(entry, dict) and isinstance(entry.get("id"), str) and entry["id"]]

    async def systemone(self, body: dict[str, Any], options: CallOptions) -> Reply:
        return Reply(501, "application/json", _NO_DECISIONS)

    def decisions_unsupported(self, reply: Reply) -> bool:
        return reply.status == 501

    def route(self, api: str) -> str | None:
        return _ROUTES.get(api)

    async def open(self, path: str, body: dict[str, Any], options: CallOptions) -> Any:
        if self.salts_prefix_cache and options.tenant_salt is not None and path == _ROUTES["openai-chat"]:
            body = salted(dict(body), options.tenant_salt)
        return await super().open(path, body, options)


def vllm_version(answer: Any) -> str | None:
    """The version in vLLM's answer to ``GET /version`` (that key alone), else None."""
    if isinstance(answer, dict) and set(answer) == {"version"} and isinstance(answer["version"], str):
        return answer["version"] or None
    return None
