"""API key material: generation, digests, constant-time checks.

A key is ``arb_proj_<43 base62 chars>`` (a project key) or ``arb_admin_<...>``
(an admin key): 256 random bits, a prefix secret scanners can find. Only a
digest is stored (HMAC-SHA-256 with the server pepper when one is set,
SHA-256 otherwise), with a display prefix and the last four characters.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

PROJECT_PREFIX = "arb_proj_"
ADMIN_PREFIX = "arb_admin_"
_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_BODY_LENGTH = 43  # 62**43 > 2**256
MAX_KEY_LENGTH = 128


@dataclass(frozen=True, slots=True)
class NewKey:
    value: str  # shown once, never stored
    digest: str
    prefix: str  # for display, e.g. "arb_proj_3fA9"
    last_four: str


def _base62(raw: bytes) -> str:
    number = int.from_bytes(raw, "big")
    chars = []
    for _ in range(_BODY_LENGTH):
        number, digit = divmod(number, 62)
        chars.append(_ALPHABET[digit])
    return "".join(chars)


class KeyHasher:
    """Turns key values into the digests stored and looked up."""

    def __init__(self, pepper: str | None = None) -> None:
        self._pepper = pepper.encode() if pepper else None

    def digest(self, value: str) -> str:
        data = value.encode("utf-8", "surrogatepass")
        if self._pepper:
            return hmac.digest(self._pepper, data, "sha256").hex()  # OpenSSL's one-shot HMAC: hmac.new's result
        return hashlib.sha256(data).hexdigest()

    def new(self, kind: str) -> NewKey:
        prefix = ADMIN_PREFIX if kind == "admin" else PROJECT_PREFIX
        value = prefix + _base62(secrets.token_bytes(32))
        return NewKey(value=value, digest=self.digest(value), prefix=value[: len(prefix) + 4],
                      last_four=value[-4:])

    def matches(self, value: str, digest: str) -> bool:
        return same_digest(self.digest(value), digest)


def same_digest(presented: str, stored: str) -> bool:
    """Whether two digests are equal, in constant time (SPEC §3)."""
    return hmac.compare_digest(presented, stored)


def kind_of(value: str) -> str | None:
    """"project", "admin", or None for something that is not an Arbiter key at all."""
    if value.startswith(PROJECT_PREFIX):
        return "project"
    if value.startswith(ADMIN_PREFIX):
        return "admin"
    return None


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > MAX_KEY_LENGTH:
        return None
    return token
