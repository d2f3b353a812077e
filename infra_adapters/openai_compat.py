"""An OpenAI-compatible server (llama.cpp's `llama-server`, LM Studio, a vLLM without decisions):
`/v1/models` and `/v1/chat/completions`. It has no decision endpoint of its own: its models
answer decisions by label reading (first-token logprobs, ``openai_logprobs``), and chat as is."""

from __future__ import annotations

from typing import Any

from infra_adapters.base import BackendProtocolError, CallOptions, RemoteModel, Reply
from infra_adapters.http import HttpBackendBase

_ROUTES = {"openai-chat": "/v1/chat/completions"}
_NO_DECISIONS = b'{"error": "an OpenAI-compatible server answers decisions by label reading only"}'


class OpenAICompatBackend(HttpBackendBase):
    kind = "openai"

    def read_version(self) -> str | None:
        """OpenAI's API has no version route; the model list says the server answers."""
        self.list_models()
        return None

    def list_models(self) -> list[RemoteModel]:
        data = self._admin_get("/v1/models")
        if not isinstance(data, dict) or not isinstance(data.get("data"), list):
            raise BackendProtocolError(f"{self.url}/v1/models did not list models")
        return [RemoteModel(name=entry["id"], capabilities=frozenset({"completion"}))
                for entry in data["data"]
                if isinstance(entry, dict) and isinstance(entry.get("id"), str) and entry["id"]]

    async def systemone(self, body: dict[str, Any], options: CallOptions) -> Reply:
        return Reply(501, "application/json", _NO_DECISIONS)

    def decisions_unsupported(self, reply: Reply) -> bool:
        return reply.status == 501

    def route(self, api: str) -> str | None:
        return _ROUTES.get(api)
