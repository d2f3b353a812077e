"""Service credentials, encrypted at rest with a key derived from ARBITER_SECRET_KEY."""

from __future__ import annotations

import base64
import hashlib

from cryptography.fernet import Fernet, InvalidToken

from app.errors import InvalidRequest
from app.settings import Settings

_PREFIX = "fernet:"


class CredentialBox:
    def __init__(self, secret: str | None) -> None:
        self._fernet = None
        if secret:
            key = hashlib.sha256(b"arbiter-credentials:" + secret.encode()).digest()
            self._fernet = Fernet(base64.urlsafe_b64encode(key))

    @classmethod
    def from_settings(cls, settings: Settings) -> CredentialBox:
        return cls(settings.secret_key.get_secret_value() if settings.secret_key else None)

    def seal(self, plaintext: str | None) -> str | None:
        if plaintext is None:
            return None
        if self._fernet is None:
            raise InvalidRequest("set ARBITER_SECRET_KEY to store a service's API key "
                                 "(it is kept encrypted with that key)")
        return _PREFIX + self._fernet.encrypt(plaintext.encode()).decode()

    def open(self, stored: str | None) -> str | None:
        if stored is None:
            return None
        if not stored.startswith(_PREFIX):
            return stored  # written before encryption existed
        if self._fernet is None:
            raise CredentialUnavailable("a service's API key is stored encrypted; set ARBITER_SECRET_KEY")
        try:
            return self._fernet.decrypt(stored[len(_PREFIX):].encode()).decode()
        except InvalidToken as exc:
            raise CredentialUnavailable(
                "a service's API key cannot be decrypted: ARBITER_SECRET_KEY changed") from exc


class CredentialUnavailable(RuntimeError):
    """A stored credential cannot be read with the configured secret."""
