"""How mesh nodes prove they hold the mesh key, without ever sending it.

A request from a node carries
``Authorization: ArbiterMesh v2;<node>;<target>;<ts>;<nonce>;<hops>;<salt>;<sig>`` and
``X-Arbiter-Mesh-Body-Digest: sha256=<hex>``, where ``target`` is the node it is meant for (always
a name: never ``*``), ``salt`` the entry node's prefix-cache salt of the caller's project (``-`` for
none) and ``sig`` HMAC-SHA-256 over the method, the path with its query, those fields, the body's
``Content-Length`` and its digest header. Nothing signed is in the body, so the receiver checks it
all on the head, before it reads a byte of the body: that it is the target, the clock window, the
signature in constant time, and that the nonce is new to every process of the node
(``nonces.py``). The body is then read under its cap and its SHA-256 compared with the signed
digest before the request is acted on. An answer carries ``X-Arbiter-Mesh-Proof``: the HMAC of the
request's nonce and the answer's body, so the caller knows the peer holds the key too.

v1 (earlier builds) signed the body's SHA-256 itself, so a node had to read a whole body before it
could tell a forged credential; this node refuses v1, naming the node that must be upgraded.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from app.errors import AuthenticationFailed
from app.mesh.nonces import NonceStore

SCHEME = "ArbiterMesh "
CREDENTIAL_VERSION = "v2"
DIGEST_HEADER = "X-Arbiter-Mesh-Body-Digest"
PROOF_HEADER = "X-Arbiter-Mesh-Proof"
# On a 401 that refuses a mesh credential: the node that sent it knows its mesh key was refused,
# and not the request by a backend behind this node (whose 401/403 passes through unchanged).
REFUSED_HEADER = "X-Arbiter-Mesh-Refused"
# On the same 401, why, as a Refusal: what the sender acts on (a peer with a new name is
# introduced again), where the message is for people and may be reworded.
REFUSAL_HEADER = "X-Arbiter-Mesh-Refusal"
ANY_NODE = "*"  # the target of v1 introductions (any node); refused everywhere now
WINDOW = 60.0  # seconds a signature is accepted either side of the receiver's clock
# How long an accepted nonce is kept: its signature's time may be WINDOW ahead of the receiver's
# clock when it arrives, and is good until WINDOW behind.
NONCE_LIFETIME = int(2 * WINDOW) + 1
_NODE_NAME = re.compile(r"^[A-Za-z0-9._:@\-]{1,100}$")
_NONCE = re.compile(r"^[0-9a-f]{32}$")
_SIGNATURE = re.compile(r"^[0-9a-f]{64}$")
_SALT = re.compile(r"^[0-9a-f]{16,128}$")
_DIGEST = re.compile(r"sha256=([0-9a-f]{64})")
# ASCII digits only: str.isdigit() also takes "²" and other digits int() cannot read (as
# app/text.py ascii_digits, with a length too).
_TIMESTAMP = re.compile(r"[0-9]{1,12}")
_HOPS = re.compile(r"[0-9]{1,3}")
_LENGTH = re.compile(r"[0-9]{1,20}")


def valid_node_name(name: str) -> bool:
    return bool(_NODE_NAME.match(name))


def valid_nonce(nonce: str) -> bool:
    return bool(_NONCE.fullmatch(nonce))


def request_target(path: str, query: bytes = b"") -> str:
    """What is signed as the path: the path and, when there is one, ``?`` and its query."""
    return f"{path}?{query.decode('latin-1')}" if query else path


def body_digest(body: bytes) -> str:
    return "sha256=" + hashlib.sha256(body).hexdigest()


class Refusal(StrEnum):
    """Why a mesh credential was refused: the value of ``X-Arbiter-Mesh-Refusal``. The values are
    part of the wire: a new one may be added, none renamed."""

    MALFORMED = "malformed"  # not a v2 credential's form, or without its length or digest header
    OLD_CREDENTIAL = "v1"  # a v1 credential, from a node of an earlier build
    ANY_NODE = "any-node"  # signed for ``*``
    LOOP = "loop"  # signed by this node
    OTHER_NODE = "other-node"  # signed for a node of another name: the one before a rename, say
    CLOCK = "clock"  # out of the time window
    WRONG_KEY = "wrong-key"
    REPLAYED = "replayed"
    BODY = "body"  # the body is not the one signed
    NO_MESH = "no-mesh"  # this node is not in a mesh


class MeshCredentialRefused(AuthenticationFailed):
    """A mesh credential this node refuses (401), marked with ``X-Arbiter-Mesh-Refused: 1`` and
    its reason in ``X-Arbiter-Mesh-Refusal``."""

    def __init__(self, reason: Refusal, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.headers[REFUSED_HEADER] = "1"
        self.headers[REFUSAL_HEADER] = reason.value


def refused_for_another_node(headers: Mapping[str, str], message: str) -> bool:
    """Whether a peer's refusal (its answer's ``headers`` and ``error`` message) is of a credential
    signed for a name it no longer has: the peer was renamed, and an introduction gives its new one."""
    reason = headers.get(REFUSAL_HEADER)
    if reason is not None:
        return reason == Refusal.OTHER_NODE
    # Nodes from before the reason header (the 0.1.0 builds with v2 credentials, from commit
    # bb442ea to issue #23) say it in words only, which those builds no longer change. Remove
    # this once no such node is left in a mesh.
    return "meant for another node" in message


@dataclass(frozen=True, slots=True)
class Claim:
    """A request's mesh credential, proved on its head; ``digest`` is what its body must hash to."""

    node: str
    target: str
    timestamp: int
    nonce: str
    hops: int
    salt: str | None
    digest: str


class MeshAuth:
    """Signs this node's requests and checks its peers'. ``nonces`` records the nonces accepted
    (shared by every process of the node); without one, a MeshAuth signs but cannot verify."""

    def __init__(self, key: str, node: str, nonces: NonceStore | None = None) -> None:
        self._key = key.encode()
        self.node = node
        self._nonces = nonces

    # -- the sending side ----------------------------------------------------------

    def sign(self, method: str, path: str, body: bytes, *, target: str, hops: int = 1,
             salt: str | None = None) -> tuple[dict[str, str], str]:
        """``(headers, nonce)`` for a request to the peer ``target``: the ``Authorization`` and the
        body digest it covers (the client sends the body's ``Content-Length``, also covered)."""
        timestamp, nonce, salt_field, digest = int(time.time()), secrets.token_hex(16), salt or "-", body_digest(body)
        fields = (self.node, target, str(timestamp), nonce, str(hops), salt_field)
        signature = self._mac(method, path, fields, str(len(body)), digest)
        return {"Authorization": f"{SCHEME}{CREDENTIAL_VERSION};{';'.join(fields)};{signature}",
                DIGEST_HEADER: digest}, nonce

    def answer_valid(self, nonce: str, body: bytes, proof: str | None, *, introduction: bool = False) -> bool:
        """Whether a peer's answer to our request (``nonce``) was made with the mesh key."""
        expected = self.introduction_proof(nonce, body) if introduction else self.answer_proof(nonce, body)
        return proof is not None and hmac.compare_digest(expected, proof)

    # -- the receiving side --------------------------------------------------------

    async def admit(self, authorization: str, method: str, path: str, headers: Mapping[str, str]) -> Claim:
        """The claim of a request's head (``headers`` by lower-case name), proved before its body
        is read: MeshCredentialRefused for a credential that is malformed, of v1, signed by this
        node, meant for another node, out of its time window, not made with the mesh key or
        replayed (BackendFailed, 503, when the nonce store is unreachable)."""
        if self._nonces is None:
            raise RuntimeError("this MeshAuth has no nonce store: it can sign requests, not verify them")
        parts = authorization[len(SCHEME):].split(";")
        if parts[0] == "v1":
            sender = parts[1] if len(parts) > 1 and valid_node_name(parts[1]) else "?"
            raise MeshCredentialRefused(
                Refusal.OLD_CREDENTIAL,
                "mesh credential v1 refused: this node takes v2 (checked before the body is read); "
                f"node {sender} runs an earlier Arbiter and must be upgraded")
        if len(parts) != 8 or parts[0] != CREDENTIAL_VERSION:
            raise MeshCredentialRefused(Refusal.MALFORMED, "malformed mesh credential")
        node, target, timestamp, nonce, hops, salt, signature = parts[1:]
        if target == ANY_NODE:
            raise MeshCredentialRefused(Refusal.ANY_NODE,
                                        "mesh credential for any node (*) refused: a mesh request names its target")
        if not (valid_node_name(node) and valid_node_name(target) and _TIMESTAMP.fullmatch(timestamp)
                and _HOPS.fullmatch(hops) and (salt == "-" or _SALT.match(salt)) and _NONCE.match(nonce)
                and _SIGNATURE.match(signature)):
            raise MeshCredentialRefused(Refusal.MALFORMED, "malformed mesh credential")
        if node == self.node:
            raise MeshCredentialRefused(Refusal.LOOP, "a request signed by this node came back to it: a mesh loop")
        if target != self.node:
            raise MeshCredentialRefused(Refusal.OTHER_NODE, f"mesh credential meant for another node ({target})")
        if abs(time.time() - int(timestamp)) > WINDOW:
            raise MeshCredentialRefused(Refusal.CLOCK,
                                        "mesh credential out of its time window (are the nodes' clocks right?)")
        length, digest = headers.get("content-length"), headers.get(DIGEST_HEADER.lower())
        if length is None or not _LENGTH.fullmatch(length):
            raise MeshCredentialRefused(Refusal.MALFORMED,
                                        "a mesh request carries the Content-Length it was signed for")
        if digest is None or not _DIGEST.fullmatch(digest):
            raise MeshCredentialRefused(Refusal.MALFORMED,
                                        f"a mesh request carries {DIGEST_HEADER}: sha256=<hex>, signed with it")
        expected = self._mac(method, path, (node, target, timestamp, nonce, hops, salt), length, digest)
        if not hmac.compare_digest(expected, signature):
            raise MeshCredentialRefused(Refusal.WRONG_KEY, "mesh credential refused: wrong mesh key")
        if not await self._nonces.first_use(nonce):
            raise MeshCredentialRefused(Refusal.REPLAYED, "mesh credential refused: replayed")
        return Claim(node, target, int(timestamp), nonce, int(hops), None if salt == "-" else salt, digest)

    def verify_body(self, claim: Claim, body: bytes) -> None:
        """MeshCredentialRefused unless ``body`` (all of it, read) is the body the claim signed."""
        if not hmac.compare_digest(body_digest(body), claim.digest):
            raise MeshCredentialRefused(Refusal.BODY,
                                        "mesh credential refused: the body is not the one that was signed")

    def answer_proof(self, nonce: str, body: bytes) -> str:
        return self._proof(b"arbiter-mesh-v1 answer\n", nonce, body)

    def introduction_proof(self, nonce: str, body: bytes) -> str:
        """The proof of an answer to ``GET /mesh/v1/hello``, which anyone may ask: a label of its
        own, so that it never stands for the answer to a signed request."""
        return self._proof(b"arbiter-mesh-v2 introduction\n", nonce, body)

    def _proof(self, label: bytes, nonce: str, body: bytes) -> str:
        message = label + nonce.encode() + b"\n" + hashlib.sha256(body).hexdigest().encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def _mac(self, method: str, path: str, fields: tuple[str, ...], length: str, digest: str) -> str:
        message = "\n".join(("arbiter-mesh-v2", method, path, *fields, length, digest)).encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()
