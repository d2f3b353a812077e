"""Web UI sessions: a signed, expiring cookie that names an admin key, and CSRF tokens.

The cookie ``arbiter_ui`` holds ``<key id>.<expires (unix seconds)>.<session id>.<signature>``, the
signature an HMAC-SHA-256 of the rest. It carries no key material: every request looks the
admin key up again by id, so a revoked or expired key ends its sessions at once. The signature
turns a forged cookie away before the database is asked; the session itself lives in the
database (app/tenancy/ui_sessions.py), so a signed cookie counts only while its session does:
sign-out, idleness and a rotated key end it on every replica.

The signing secret is derived from ``ARBITER_SECRET_KEY`` when it is set (every replica shares
sessions and they survive restarts); without it each process draws a random one, and sessions
last only as long as that process.

CSRF: a form carries ``csrf``, a fetch sends ``X-CSRF-Token``; both are an HMAC of the session
token, so they cannot be made without the cookie. The sign-in form, before any session exists,
is bound to a random nonce in its own short-lived cookie (``arbiter_ui_signin``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

from app.text import ascii_digits

COOKIE = "arbiter_ui"
SIGNIN_COOKIE = "arbiter_ui_signin"
COOKIE_PATH = "/ui"
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"
SIGNIN_SECONDS = 3600  # how long a sign-in form stays valid
_MAX_TOKEN = 200


@dataclass(frozen=True, slots=True)
class UiSession:
    """A verified session cookie: whose it is and until when."""

    key_id: int
    expires: int  # unix seconds
    token: str


class SessionSigner:
    def __init__(self, secret_key: str | None) -> None:
        if secret_key:
            self._secret = hmac.new(secret_key.encode(), b"arbiter web ui sessions v1", hashlib.sha256).digest()
            self.shared = True
        else:
            self._secret = secrets.token_bytes(32)
            self.shared = False

    def _mac(self, purpose: str, message: str) -> str:
        digest = hmac.new(self._secret, f"{purpose}|{message}".encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

    def issue(self, key_id: int, seconds: int, now: float | None = None) -> UiSession:
        expires = int(now if now is not None else time.time()) + seconds
        body = f"{key_id}.{expires}.{secrets.token_urlsafe(32)}"  # the session id: 256 random bits
        return UiSession(key_id, expires, f"{body}.{self._mac('session', body)}")

    def verify(self, token: str | None, now: float | None = None) -> UiSession | None:
        """The session of a cookie value, or None when it is absent, forged, malformed or expired."""
        if not token or len(token) > _MAX_TOKEN:
            return None
        body, _, signature = token.rpartition(".")
        if not hmac.compare_digest(signature.encode(), self._mac("session", body).encode()):
            return None
        parts = body.split(".")
        if len(parts) != 3 or not ascii_digits(parts[0]) or not ascii_digits(parts[1]):
            return None
        key_id, expires = int(parts[0]), int(parts[1])
        if expires <= (now if now is not None else time.time()):
            return None
        return UiSession(key_id, expires, token)

    def csrf(self, session: UiSession) -> str:
        return self._mac("csrf", session.token)

    def csrf_ok(self, session: UiSession, sent: str | None) -> bool:
        return bool(sent) and hmac.compare_digest(str(sent).encode(), self.csrf(session).encode())

    def signin_pair(self) -> tuple[str, str]:
        """(cookie nonce, form token) for a sign-in form."""
        nonce = f"{int(time.time()) + SIGNIN_SECONDS}.{secrets.token_urlsafe(16)}"
        return nonce, self._mac("sign-in", nonce)

    def signin_ok(self, nonce: str | None, sent: str | None) -> bool:
        if not nonce or not sent or len(nonce) > _MAX_TOKEN:
            return False
        if not hmac.compare_digest(str(sent).encode(), self._mac("sign-in", nonce).encode()):
            return False
        expires = nonce.partition(".")[0]
        return ascii_digits(expires) and int(expires) > time.time()
