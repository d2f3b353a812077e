"""A stand-in for a mesh node of an older Arbiter, one that does not know decision models.

It speaks the mesh exchange (signed with the mesh key, both ways) and behaves as such a node
would: it refuses, as a whole, the model list of a peer that reports a decision model, and it
announces its own models (none of which can answer decisions) with ``decision_models: false``.
"""

from __future__ import annotations

import secrets
from typing import Any

import httpx
import orjson
from aiohttp import web

from app.errors import AuthenticationFailed
from app.mesh.auth import PROOF_HEADER, MeshAuth
from app.mesh.hello import HELLO_PATH, hello_answer
from app.mesh.protocol import EXCHANGE_PATH

VERSION = "0.9.0"


class MemoryNonces:
    """The nonces a stand-in has accepted, in its one process (the real store is shared: app/mesh/nonces.py)."""

    def __init__(self) -> None:
        self._seen: set[str] = set()

    async def first_use(self, nonce: str) -> bool:
        if nonce in self._seen:
            return False
        self._seen.add(nonce)
        return True

    async def purge(self) -> None:
        return None


def make_old_peer_app(key: str, name: str = "old-node", models: list[dict[str, Any]] | None = None) -> web.Application:
    auth = MeshAuth(key, name, MemoryNonces())
    announced = models if models is not None else [
        {"name": "legacy-chat", "type": "ollama", "capabilities": ["completion"], "path": [name]}]

    async def hello(request: web.Request) -> web.Response:
        status, answer, headers = hello_answer(auth, request.query.get("nonce"))
        return web.Response(body=answer, status=status, content_type="application/json", headers=headers)

    async def exchange(request: web.Request) -> web.Response:
        try:
            claim = await auth.admit(request.headers.get("Authorization", ""), "POST", EXCHANGE_PATH,
                                     request.headers)
            body = await request.read()
            auth.verify_body(claim, body)
        except AuthenticationFailed as error:
            return web.json_response({"error": error.message}, status=401)
        theirs = orjson.loads(body)
        decision = [m["name"] for m in theirs.get("models", []) if "decision" in m.get("capabilities", [])]
        answer: dict[str, Any] = {"protocol": 1, "node": name, "url": None, "version": VERSION,
                                  "decision_models": False, "models": announced, "accepted": not decision,
                                  "reason": (f"this node (version {VERSION}) does not know decision models; it "
                                             f"refuses a model list that has one ({', '.join(decision)})")
                                  if decision else None}
        raw = orjson.dumps(answer)
        return web.Response(body=raw, content_type="application/json",
                            headers={PROOF_HEADER: auth.answer_proof(claim.nonce, raw)})

    app = web.Application()
    app.router.add_get(HELLO_PATH, hello)
    app.router.add_post(EXCHANGE_PATH, exchange)
    return app


def connect_as_old_node(url: str, key: str, refused: str | None, name: str = "old-node") -> httpx.Response:
    """An older node connecting to the node at ``url``, as it would: an introduction, then an
    exchange signed for the name it gave. ``refused``: why it refused the model list that node
    answered with before (None: it did not)."""
    auth = MeshAuth(key, name)
    introduction = httpx.get(url + HELLO_PATH, params={"nonce": secrets.token_hex(16)})
    introduction.raise_for_status()
    body = orjson.dumps({"protocol": 1, "node": name, "url": None, "version": VERSION, "decision_models": False,
                         "refused": refused, "models": [{"name": "legacy-chat", "type": "ollama",
                                                         "capabilities": ["completion"], "path": [name]}]})
    headers, _ = auth.sign("POST", EXCHANGE_PATH, body, target=introduction.json()["node"])
    response = httpx.post(url + EXCHANGE_PATH, content=body, headers=headers)
    response.raise_for_status()
    return response
