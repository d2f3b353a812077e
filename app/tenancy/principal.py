"""Who is calling: what a resolved key says, cached in memory on the hot path."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from app.errors import PermissionDenied


@dataclass(frozen=True, slots=True)
class Principal:
    key_id: int
    kind: str  # "project" or "admin"
    key_prefix: str
    project_id: int | None
    project_name: str | None
    allowed_models: frozenset[str] | None  # None: every model
    archived: bool
    expires_at: dt.datetime | None
    revoked_at: dt.datetime | None
    project_rpm: int | None = None
    project_tpm: int | None = None
    key_rpm: int | None = None
    key_tpm: int | None = None

    def usable(self, now: dt.datetime) -> bool:
        if self.revoked_at is not None and self.revoked_at <= now:
            return False
        return self.expires_at is None or self.expires_at > now

    def may_use(self, model: str) -> bool:
        if self.archived:
            return False
        return self.allowed_models is None or model in self.allowed_models

    def authorize(self, model: str) -> None:
        """PermissionDenied (403) unless this principal may use ``model``; whether the model
        exists plays no part, so keys cannot probe what is installed."""
        if self.may_use(model):
            return
        if self.archived:
            raise PermissionDenied(f"project '{self.project_name}' is archived")
        raise PermissionDenied(f"model '{model}' is not allowed for this project")

    @property
    def actor(self) -> str:
        return f"{self.kind}-key:{self.key_id}:{self.key_prefix}"
