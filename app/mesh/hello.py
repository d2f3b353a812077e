"""The introduction that opens a mesh link: ``GET /mesh/v1/hello?nonce=<32 hex>``.

Before a node knows a peer's name it cannot sign a request for it, and a credential for any node
(``*``, as v1 had) would be good at every node it was replayed to. So the first contact carries no
credential and no body: the peer answers its name alone, with a proof (the HMAC of the caller's
nonce and the answer, under a label of its own, so it never stands for an answer to a signed
request) that it holds the mesh key. Every exchange after that is signed for that name. Anyone
who asks learns the node's mesh name, and nothing else.
"""

from __future__ import annotations

import logging
import secrets

import httpx
import orjson

from app.errors import InvalidRequest, NotFound
from app.mesh.auth import PROOF_HEADER, MeshAuth, valid_node_name, valid_nonce
from app.mesh.protocol import PROTOCOL

HELLO_PATH = "/mesh/v1/hello"
_MAX_ANSWER = 4096


class IntroductionFailed(Exception):
    """No proven name from the peer: ``state`` and ``message`` are what the peer's status shows."""

    def __init__(self, state: str, message: str, level: int = logging.WARNING) -> None:
        super().__init__(message)
        self.state, self.message, self.level = state, message, level


def hello_answer(auth: MeshAuth | None, nonce: str | None) -> tuple[int, bytes, dict[str, str]]:
    """``(status, body, headers)`` of the answer to an introduction."""
    if auth is None:
        error: InvalidRequest | NotFound = NotFound("this node is not in a mesh")
        return error.status, error.body(), error.headers
    if nonce is None or not valid_nonce(nonce):
        error = InvalidRequest("an introduction carries ?nonce= with 32 lower-case hex digits")
        return error.status, error.body(), error.headers
    body = orjson.dumps({"protocol": PROTOCOL, "node": auth.node})
    return 200, body, {PROOF_HEADER: auth.introduction_proof(nonce, body)}


async def introduce(client: httpx.AsyncClient, auth: MeshAuth, url: str) -> tuple[str, bool]:
    """The name the node at ``url`` gives, and whether it proved it with the mesh key (False: it
    holds another key, or is not the node it names); IntroductionFailed when there is no name."""
    nonce = secrets.token_hex(16)
    try:
        response = await client.get(url + HELLO_PATH, params={"nonce": nonce})
    except httpx.TimeoutException as exc:
        raise IntroductionFailed("unreachable", f"{url} did not answer the introduction in time") from exc
    except (httpx.HTTPError, OSError, ValueError) as exc:
        raise IntroductionFailed("unreachable", f"cannot reach {url}: {type(exc).__name__}") from exc
    if response.status_code in (404, 405):
        raise IntroductionFailed(
            "incompatible", f"{url} has no {HELLO_PATH} (HTTP {response.status_code}): an earlier Arbiter, "
            "whose mesh credentials (v1) this node neither sends nor takes, or not an Arbiter; upgrade it",
            logging.ERROR)
    if response.status_code != 200 or len(response.content) > _MAX_ANSWER:
        raise IntroductionFailed("unreachable", f"{url} answered HTTP {response.status_code} to the introduction")
    try:
        name = orjson.loads(response.content).get("node")
    except (orjson.JSONDecodeError, AttributeError):
        name = None
    if not isinstance(name, str) or not valid_node_name(name):
        raise IntroductionFailed("unreachable", f"{url} introduced itself without a valid node name")
    if name == auth.node:
        raise IntroductionFailed("unreachable", f"{url} is this node itself (the same node name {name})")
    return name, auth.answer_valid(nonce, response.content, response.headers.get(PROOF_HEADER), introduction=True)
