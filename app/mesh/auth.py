"""How mesh nodes prove they hold the mesh key, without ever sending it.

A request from a node carries
``Authorization: ArbiterMesh v1;<node>;<target>;<ts>;<nonce>;<hops>;<salt>;<sig>``, where
``target`` is the node it is meant for (``*`` only for the introduction that opens a link, before
the peer's name is known: see node.py), ``salt`` the entry node's prefix-cache salt of the
caller's project (``-`` for none) and ``sig`` HMAC-SHA-256 over the method, the path, those
fields and the SHA-256 of the body. The receiver checks that it is the target, the clock window,
the signature in constant time, and that the nonce is new to every process of the node
(``nonces.py``). An answer to a model-list exchange carries ``X-Arbiter-Mesh-Proof``: the HMAC of
the request's nonce and the answer's body, so the caller knows the peer holds the key too.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass

from app.errors import AuthenticationFailed
from app.mesh.nonces import NonceStore

SCHEME = "ArbiterMesh "
PROOF_HEADER = "X-Arbiter-Mesh-Proof"
# On a 401 that refuses a mesh credential: the node that sent it knows its mesh key was refused,
# and not the request by a backend behind this node (whose 401/403 passes through unchanged).
REFUSED_HEADER = "X-Arbiter-Mesh-Refused"
ANY_NODE = "*"
WINDOW = 60.0  # seconds a signature is accepted either side of the receiver's clock
# How long an accepted nonce is kept: its signature's time may be WINDOW ahead of the receiver's
# clock when it arrives, and is good until WINDOW behind.
NONCE_LIFETIME = int(2 * WINDOW) + 1
_NODE_NAME = re.compile(r"^[A-Za-z0-9._:@\-]{1,100}$")
_NONCE = re.compile(r"^[0-9a-f]{32}$")
_SIGNATURE = re.compile(r"^[0-9a-f]{64}$")
_SALT = re.compile(r"^[0-9a-f]{16,128}$")
# ASCII digits only: str.isdigit() also takes "²" and other digits int() cannot read.
_TIMESTAMP = re.compile(r"[0-9]{1,12}")
_HOPS = re.compile(r"[0-9]{1,3}")


def valid_node_name(name: str) -> bool:
    return bool(_NODE_NAME.match(name))


class MeshCredentialRefused(AuthenticationFailed):
    """A mesh credential this node refuses (401), marked with ``X-Arbiter-Mesh-Refused: 1``."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.headers[REFUSED_HEADER] = "1"


@dataclass(frozen=True, slots=True)
class Claim:
    """A request's mesh credential, read from its header; its signature is checked against the body."""

    node: str
    target: str
    timestamp: int
    nonce: str
    hops: int
    salt: str | None
    signature: str
    method: str
    path: str


class MeshAuth:
    """Signs this node's requests and checks its peers'. ``nonces`` records the nonces accepted
    (shared by every process of the node); without one, a MeshAuth signs but cannot verify."""

    def __init__(self, key: str, node: str, nonces: NonceStore | None = None) -> None:
        self._key = key.encode()
        self.node = node
        self._nonces = nonces

    # -- the sending side ----------------------------------------------------------

    def sign(self, method: str, path: str, body: bytes, hops: int = 1, salt: str | None = None,
             target: str = ANY_NODE) -> tuple[str, str]:
        """``(Authorization header value, nonce)`` for a request to the peer ``target``."""
        timestamp, nonce, salt_field = int(time.time()), secrets.token_hex(16), salt or "-"
        signature = self._mac(method, path, self.node, target, timestamp, nonce, hops, salt_field, body)
        return f"{SCHEME}v1;{self.node};{target};{timestamp};{nonce};{hops};{salt_field};{signature}", nonce

    def answer_valid(self, nonce: str, body: bytes, proof: str | None) -> bool:
        """Whether a peer's answer to our request (``nonce``) was made with the mesh key."""
        return proof is not None and hmac.compare_digest(self.answer_proof(nonce, body), proof)

    # -- the receiving side --------------------------------------------------------

    def claim(self, authorization: str, method: str, path: str, *, any_target: bool = False) -> Claim:
        """The header's claim, checked for form, target and time (MeshCredentialRefused otherwise).
        ``any_target``: the model-list exchange, whose introduction a node signs for any node (``*``)."""
        parts = authorization[len(SCHEME):].split(";")
        if len(parts) != 8 or parts[0] != "v1":
            raise MeshCredentialRefused("malformed mesh credential")
        _, node, target, timestamp, nonce, hops, salt, signature = parts
        if not (valid_node_name(node) and (target == ANY_NODE or valid_node_name(target))
                and _TIMESTAMP.fullmatch(timestamp) and _HOPS.fullmatch(hops)
                and (salt == "-" or _SALT.match(salt)) and _NONCE.match(nonce) and _SIGNATURE.match(signature)):
            raise MeshCredentialRefused("malformed mesh credential")
        if node == self.node:
            raise MeshCredentialRefused("a request signed by this node came back to it: a mesh loop")
        if target != self.node and not (any_target and target == ANY_NODE):
            raise MeshCredentialRefused(f"mesh credential meant for another node ({target})")
        if abs(time.time() - int(timestamp)) > WINDOW:
            raise MeshCredentialRefused("mesh credential out of its time window (are the nodes' clocks right?)")
        return Claim(node, target, int(timestamp), nonce, int(hops), None if salt == "-" else salt, signature,
                     method, path)

    async def verify(self, claim: Claim, body: bytes) -> None:
        """MeshCredentialRefused unless the claim was signed with the mesh key over this body, and
        its nonce is new to this node (BackendFailed, 503, when the nonce store is unreachable)."""
        if self._nonces is None:
            raise RuntimeError("this MeshAuth has no nonce store: it can sign requests, not verify them")
        expected = self._mac(claim.method, claim.path, claim.node, claim.target, claim.timestamp, claim.nonce,
                             claim.hops, claim.salt or "-", body)
        if not hmac.compare_digest(expected, claim.signature):
            raise MeshCredentialRefused("mesh credential refused: wrong mesh key")
        if not await self._nonces.first_use(claim.nonce):
            raise MeshCredentialRefused("mesh credential refused: replayed")

    def answer_proof(self, nonce: str, body: bytes) -> str:
        message = b"arbiter-mesh-v1 answer\n" + nonce.encode() + b"\n" + hashlib.sha256(body).hexdigest().encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def _mac(self, method: str, path: str, node: str, target: str, timestamp: int, nonce: str, hops: int,
             salt: str, body: bytes) -> str:
        message = "\n".join(("arbiter-mesh-v1", method, path, node, target, str(timestamp), nonce, str(hops), salt,
                             hashlib.sha256(body).hexdigest())).encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()
