"""A mesh peer as a backend: the forwarding path sends a request for a model another node has
through this, like through any replica. The peer speaks Arbiter's public API; the request is
signed with the mesh key and carries its hop count."""

from __future__ import annotations

from typing import Any

import orjson

from app.mesh.auth import ANY_NODE, REFUSED_HEADER, MeshAuth
from infra_adapters.base import CallOptions, RemoteModel, Reply, Stream
from infra_adapters.http import HttpBackendBase
from infra_adapters.streams import AiohttpStream, read_reply

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

    async def read_version(self) -> str | None:  # pragma: no cover - peers announce theirs in the exchange
        return None

    async def list_models(self) -> list[RemoteModel]:  # pragma: no cover - likewise
        return []

    async def systemone(self, body: dict[str, Any], options: CallOptions) -> Reply:
        return await self._post("/v1/systemone", body, options)

    async def _post(self, path: str, body: dict[str, Any], options: CallOptions) -> Reply:
        """Through ``open``, never the lean client of other backends (infra_adapters/h1.py): the peer
        refuses what is not signed with the mesh key for this very body, target and hop count, and
        the lean client sends fixed headers, signing nothing."""
        return await read_reply(await self.open(path, body, options), options.max_reply_bytes)

    def decisions_unsupported(self, reply: Reply) -> bool:
        # 405: the peer's holders of the model cannot answer decisions. A 404 is the route's own (the
        # model is not there) and comes back as it came: every peer this node can talk to has
        # /v1/decisions, since the nodes from before that route sign v1 mesh credentials, which this
        # node refuses (auth.py). A route added to _ROUTES later needs peers to announce it in the
        # exchange: an older peer's unknown-route 404 differs from a route's own only in wording.
        return reply.status == 405

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
