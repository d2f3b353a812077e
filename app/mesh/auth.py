"""How mesh nodes prove they hold the mesh key, without ever sending it.

A request from a node carries ``Authorization: ArbiterMesh v1;<node>;<ts>;<nonce>;<hops>;<salt>;<sig>``,
where ``salt`` is the entry node's prefix-cache salt of the caller's project (``-`` for none) and
``sig`` is HMAC-SHA-256 over the method, the path, those fields and the SHA-256 of the body. The receiver checks the clock window, that the nonce is new, and the signature in
constant time. An answer to a model-list exchange carries ``X-Arbiter-Mesh-Proof``: the HMAC of
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

SCHEME = "ArbiterMesh "
PROOF_HEADER = "X-Arbiter-Mesh-Proof"
HOPS_HEADER = "X-Arbiter-Mesh-Hops"
WINDOW = 60.0  # seconds a signature is accepted either side of the receiver's clock
_NONCES_MAX = 200_000
_NODE_NAME = re.compile(r"^[A-Za-z0-9._:@\-]{1,100}$")


def valid_node_name(name: str) -> bool:
    return bool(_NODE_NAME.match(name))


@dataclass(frozen=True, slots=True)
class Claim:
    """A request's mesh credential, read from its header; its signature is checked against the body."""

    node: str
    timestamp: int
    nonce: str
    hops: int
    salt: str | None
    signature: str
    method: str
    path: str


class MeshAuth:
    def __init__(self, key: str, node: str) -> None:
        self._key = key.encode()
        self.node = node
        self._seen: dict[str, float] = {}

    # -- the sending side ----------------------------------------------------------

    def sign(self, method: str, path: str, body: bytes, hops: int = 1, salt: str | None = None) -> tuple[str, str]:
        """``(Authorization header value, nonce)`` for a request to a peer."""
        timestamp, nonce, salt_field = int(time.time()), secrets.token_hex(16), salt or "-"
        signature = self._mac(method, path, self.node, timestamp, nonce, hops, salt_field, body)
        return f"{SCHEME}v1;{self.node};{timestamp};{nonce};{hops};{salt_field};{signature}", nonce

    def answer_valid(self, nonce: str, body: bytes, proof: str | None) -> bool:
        """Whether a peer's answer to our request (``nonce``) was made with the mesh key."""
        return proof is not None and hmac.compare_digest(self.answer_proof(nonce, body), proof)

    # -- the receiving side --------------------------------------------------------

    def claim(self, authorization: str, method: str, path: str) -> Claim:
        """The header's claim, checked for form and time (AuthenticationFailed otherwise)."""
        parts = authorization[len(SCHEME):].split(";")
        if len(parts) != 7 or parts[0] != "v1":
            raise AuthenticationFailed("malformed mesh credential")
        _, node, timestamp, nonce, hops, salt, signature = parts
        if not (valid_node_name(node) and timestamp.isdigit() and hops.isdigit() and len(hops) < 4
                and (salt == "-" or re.fullmatch(r"[0-9a-f]{16,128}", salt))
                and re.fullmatch(r"[0-9a-f]{32}", nonce) and re.fullmatch(r"[0-9a-f]{64}", signature)):
            raise AuthenticationFailed("malformed mesh credential")
        if abs(time.time() - int(timestamp)) > WINDOW:
            raise AuthenticationFailed("mesh credential out of its time window (are the nodes' clocks right?)")
        return Claim(node, int(timestamp), nonce, int(hops), None if salt == "-" else salt, signature, method, path)

    def verify(self, claim: Claim, body: bytes) -> None:
        """AuthenticationFailed unless the claim was signed with the mesh key over this body, once."""
        expected = self._mac(claim.method, claim.path, claim.node, claim.timestamp, claim.nonce, claim.hops,
                             claim.salt or "-", body)
        if not hmac.compare_digest(expected, claim.signature):
            raise AuthenticationFailed("mesh credential refused: wrong mesh key")
        now = time.monotonic()
        if claim.nonce in self._seen:
            raise AuthenticationFailed("mesh credential refused: replayed")
        if len(self._seen) >= _NONCES_MAX:
            self._seen = {n: t for n, t in self._seen.items() if t > now}
            if len(self._seen) >= _NONCES_MAX:
                self._seen.clear()
        self._seen[claim.nonce] = now + 2 * WINDOW

    def answer_proof(self, nonce: str, body: bytes) -> str:
        message = b"arbiter-mesh-v1 answer\n" + nonce.encode() + b"\n" + hashlib.sha256(body).hexdigest().encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def _mac(self, method: str, path: str, node: str, timestamp: int, nonce: str, hops: int, salt: str,
             body: bytes) -> str:
        message = "\n".join(("arbiter-mesh-v1", method, path, node, str(timestamp), nonce, str(hops), salt,
                             hashlib.sha256(body).hexdigest())).encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()
