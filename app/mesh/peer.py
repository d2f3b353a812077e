"""A mesh peer as this node sees it (its state, version and models), and the URLs peers are
given by. Split from node.py, which runs the exchanges and turns peers into routes."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from app.errors import ArbiterError, InvalidRequest, NotFound, Unsupported, UpstreamAuthFailed
from app.mesh.protocol import RemoteModel, has_userinfo


@dataclass(eq=False)
class Peer:
    url: str | None
    direction: str  # "outbound": this node connects to it; "inbound": it connects to this node
    source: str  # "config" (ARBITER_MESH_PEERS), "admin" (the admin API) or "inbound"
    peer_id: int | None = None
    name: str | None = None
    state: str = "connecting"
    version: str | None = None
    decision_models: bool | None = None
    models: list[RemoteModel] = field(default_factory=list)
    last_contact: dt.datetime | None = None
    seen: float = 0.0  # time.monotonic() of the last good exchange
    error: str | None = None
    failures: int = 0
    refused_by_peer: str | None = None  # the peer refused this node's model list: why

    def view(self) -> dict[str, Any]:
        return {"id": self.peer_id, "name": self.name, "url": self.url, "direction": self.direction,
                "source": self.source, "state": self.state, "version": self.version,
                "decision_models": self.decision_models,
                "last_contact": self.last_contact.isoformat() if self.last_contact else None,
                "error": self.error, "refused_by_peer": self.refused_by_peer,
                "models": [m.view() for m in self.models]}

    def legacy_route(self, model: RemoteModel) -> bool:
        """Whether the route to ``model`` through this peer passes a node that does not know
        decision models: this peer, or one further on (the peer said so)."""
        return self.decision_models is False or model.legacy

    def blocked_errors(self, name: str) -> dict[str, ArbiterError]:
        """What a request for ``name``, a model only this unusable peer has, gets (per operation)."""
        if self.state == "key_rejected":
            error: ArbiterError = UpstreamAuthFailed(
                f"model '{name}' is on mesh node '{self.name}', which rejected this node's mesh key; every "
                "node needs the same ARBITER_MESH_KEY")
            return {"decision": error, "chat": error}
        why = (f"mesh node '{self.name}' (version {self.version}) does not know decision models and refused "
               "this node's model list")
        return {"decision": Unsupported(f"model '{name}' is only on {why}; it cannot answer decisions"),
                "chat": NotFound(f"model '{name}' is only on {why}")}


def loopback(url: str) -> bool:
    host = (urlsplit(url).hostname or "").lower()
    return host in ("localhost", "::1") or host.startswith("127.")


def configured_peers(value: str) -> list[str]:
    return [normalized_url(part) for part in value.split(",") if part.strip()]


def normalized_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if has_userinfo(url):  # it would show in the status, the logs and errors; never echoed
        raise InvalidRequest("a mesh peer URL must not carry a user or password (peers prove the mesh key "
                             "instead); give it as http://node-b:8080")
    if not url.startswith(("http://", "https://")) or len(url) > 500 or " " in url:
        raise InvalidRequest(f"a mesh peer is a base URL such as http://node-b:8080, not {url[:100]!r}")
    return url
