"""A mesh peer as a backend: the forwarding path sends a request for a model another node has
through this, like through any replica. The peer speaks Arbiter's public API; the request is
signed with the mesh key and carries its hop count."""

from __future__ import annotations

from typing import Any

import orjson

from app.mesh.auth import ANY_NODE, REFUSED_HEADER, MeshAuth
from infra_adapters.base import CallOptions, RemoteModel, Reply, Stream
from infra_adapters.http import AiohttpStream, HttpBackendBase

_ROUTES = {"openai-chat": "/v1/chat/completions", "ollama-chat": "/api/chat",
           "openai-decisions": "/v1/decisions"}


class MeshBackend(HttpBackendBase):
    kind = "mesh"

    def __init__(self, url: str, auth: MeshAuth, *, connect_timeout: float, pool_size: int) -> None:
        super().__init__(url, connect_timeout=connect_timeout, pool_size=pool_size)
        self._auth = auth
        self.target = ANY_NODE  # the peer's node name, once known (a credential for any node is refused)

    @property
    def has_credential(self) -> bool:
        return True  # the mesh credential

    def rejected_own_credential(self, answer: Reply | Stream) -> bool:
        # Only a refusal the peer marked as one of our mesh credential: any other 401/403 is the
        # backend's behind the peer, about the request, and passes through (SPEC §1).
        return answer.status in (401, 403) and answer.credential_refused

    def read_version(self) -> str | None:  # pragma: no cover - peers announce theirs in the exchange
        return None

    def list_models(self) -> list[RemoteModel]:  # pragma: no cover - likewise
        return []

    async def systemone(self, body: dict[str, Any], options: CallOptions) -> Reply:
        return await self._post("/v1/systemone", body, options)

    def decisions_unsupported(self, reply: Reply) -> bool:
        # 405: the peer's holders of the model cannot answer decisions. Arbiter's unknown-route 404
        # (``{"error": "no route POST /v1/decisions", ...}``): a peer from before that route, which
        # gets the request translated onto /v1/systemone instead, as a vLLM without it does. The
        # route's own 404 (the model is not there) has OpenAI's shape, with an object as ``error``.
        return reply.status == 405 or (reply.status == 404 and _unknown_route(reply.body))

    def route(self, api: str) -> str | None:
        return _ROUTES.get(api)

    async def open(self, path: str, body: dict[str, Any], options: CallOptions) -> AiohttpStream:
        data = orjson.dumps(body)
        signed, _ = self._auth.sign("POST", path, data, target=self.target, hops=options.mesh_hops + 1,
                                    salt=options.tenant_salt)
        headers = {"Content-Type": "application/json", "Accept-Encoding": "identity", "User-Agent": "arbiter",
                   **options.headers, **signed}
        stream = await self._open(path, data, headers, options)
        stream.credential_refused = stream.header(REFUSED_HEADER) == "1"
        return stream


def _unknown_route(body: bytes) -> bool:
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    error = answer.get("error") if isinstance(answer, dict) else None
    return isinstance(error, str) and error.startswith("no route ")
