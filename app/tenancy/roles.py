"""Admin roles (SPEC §3): what an admin key may do, decided in memory from its Principal.

    owner          everything, admin keys included
    operator       services, models, installs and the mesh, and every read; no keys, no projects
    viewer         reads only
    project-admin  its named projects: their keys, limits and usage; nothing else

A route (admin API or web UI) declares the ``Need`` it has; ``refusal`` says why a principal may
not, or None. The callers answer a refusal with 403 ``permission_error`` and audit it.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from app.errors import InvalidRequest
from app.tenancy.principal import Principal

OWNER, OPERATOR, VIEWER, PROJECT_ADMIN = "owner", "operator", "viewer", "project-admin"
ROLES = (OWNER, OPERATOR, VIEWER, PROJECT_ADMIN)
DENIED_ACTION = "permission.denied"  # the audit action of a refusal


class Need(StrEnum):
    """What a route asks of the caller's role."""

    READ = "read"                      # a read of the whole gateway: services, models, mesh, audit, admin keys
    OPERATE = "operate"                # a change to services, models, installs or the mesh
    OWNER = "owner"                    # organizations, creating projects, allowlists and archiving, admin keys
    SCOPED_READ = "scoped-read"        # a list each role reads; a project-admin sees its projects' part only
    PROJECT_READ = "project-read"      # a read of one named project: it, its keys, its usage
    PROJECT_MANAGE = "project-manage"  # one named project's keys and limits
    KEY_MANAGE = "key-manage"          # one key by id (its limits, revocation, rotation): the key's project
    KEY_READ = "key-read"              # a read of one key by id: every reader, a project-admin its projects' keys


_GRANTS: dict[str, frozenset[Need]] = {
    OWNER: frozenset(Need),
    OPERATOR: frozenset({Need.READ, Need.OPERATE, Need.SCOPED_READ, Need.PROJECT_READ, Need.KEY_READ}),
    VIEWER: frozenset({Need.READ, Need.SCOPED_READ, Need.PROJECT_READ, Need.KEY_READ}),
    PROJECT_ADMIN: frozenset({Need.SCOPED_READ}),  # and the project needs, for its own projects
}
_PROJECT_NEEDS = frozenset({Need.PROJECT_READ, Need.PROJECT_MANAGE, Need.KEY_MANAGE, Need.KEY_READ})
_WHAT = {Need.READ: "read the whole gateway's state", Need.OPERATE: "change services, models or the mesh",
         Need.OWNER: "manage organizations, projects or admin keys", Need.SCOPED_READ: "read this",
         Need.PROJECT_READ: "read this project", Need.PROJECT_MANAGE: "manage this project's keys and limits",
         Need.KEY_MANAGE: "manage this key", Need.KEY_READ: "read this key"}


def role_of(principal: Principal) -> str:
    """An admin key's role; a key made before roles existed (NULL) is an owner."""
    return principal.role or OWNER


def refusal(principal: Principal, need: Need, project: str | None = None) -> str | None:
    """Why ``principal`` may not do what ``need`` names (on ``project``, for the project needs;
    None there: no project it may manage, such as an admin key or a key that does not exist), or
    None when it may."""
    role = role_of(principal)
    if need in _GRANTS.get(role, frozenset()):
        return None
    if role == PROJECT_ADMIN and need in _PROJECT_NEEDS and project is not None \
            and project in principal.admin_projects:
        return None
    return f"an admin key with the role '{role}' may not {_WHAT[need]}"


def refusable(need: Need) -> bool:
    """Whether some role is refused ``need`` (somewhere), so that a route needing it can answer
    403: every need but SCOPED_READ, which every role has (a project-admin reads its part)."""
    return any(need not in _GRANTS[role] for role in ROLES)


def allows(principal: Principal, need: Need, project: str | None = None) -> bool:
    return refusal(principal, need, project) is None


def visible_projects(principal: Principal) -> frozenset[str] | None:
    """The projects whose part of a scoped list this principal sees; None: every project."""
    return principal.admin_projects if role_of(principal) == PROJECT_ADMIN else None


def checked_role(role: str | None, projects: Iterable[str] | None) -> tuple[str, list[str]]:
    """A new admin key's role (omitted: owner) and the project names it carries: required for a
    project-admin and refused for any other role."""
    role = role or OWNER
    if role not in ROLES:
        raise InvalidRequest(f"role must be one of {', '.join(ROLES)}, not {role[:40]!r}")
    names = sorted(set(projects or ()))
    if role == PROJECT_ADMIN and not names:
        raise InvalidRequest("a project-admin key needs its projects: name at least one")
    if role != PROJECT_ADMIN and names:
        raise InvalidRequest(f"projects are only for project-admin keys, not for the role '{role}'")
    return role, names
