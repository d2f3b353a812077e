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
    # A request another mesh node forwarded (kind "mesh"): checked there, not here.
    mesh_hops: int = 0
    mesh_salt: str | None = None  # the entry node's prefix-cache salt of the caller's project
    # Admin keys: the role (app/tenancy/roles.py; None reads as owner) and, for a project-admin,
    # the names of the projects it may manage.
    role: str | None = None
    admin_projects: frozenset[str] = frozenset()

    @property
    def limited(self) -> bool:
        """Whether any rate limit applies (app/tenancy/limits.py ``limits_of``): the hot path skips
        the limiter for a principal with none."""
        return bool(self.project_rpm or self.project_tpm or self.key_rpm or self.key_tpm)

    def usable(self, now: dt.datetime) -> bool:
        if self.revoked_at is not None and self.revoked_at <= now:
            return False
        return self.expires_at is None or self.expires_at > now

    def may_use(self, model: str) -> bool:
        if self.archived:
            return False
        return self.allowed_models is None or model in self.allowed_models

    def authorize(self, model: str, asked: str | None = None) -> None:
        """PermissionDenied (403) unless this principal may use ``model``; whether the model
        exists plays no part, so keys cannot probe what is installed. ``asked`` is the name the
        caller sent when it is an alias of ``model``: the allowlist holds for the target, and the
        refusal names what was asked (never the target the caller may not see)."""
        if self.may_use(model):
            return
        if self.archived:
            raise PermissionDenied(f"project '{self.project_name}' is archived")
        raise PermissionDenied(f"model '{asked or model}' is not allowed for this project")

    @classmethod
    def mesh_node(cls, node: str, hops: int, salt: str | None) -> Principal:
        """A mesh peer forwarding a request: the entry node checked key, allowlist and limits,
        and counts usage; here it is served as it is, and never billed."""
        return cls(key_id=0, kind="mesh", key_prefix=node, project_id=None, project_name=None,
                   allowed_models=None, archived=False, expires_at=None, revoked_at=None, mesh_hops=hops,
                   mesh_salt=salt)

    @property
    def actor(self) -> str:
        return f"{self.kind}-key:{self.key_id}:{self.key_prefix}"
