"""Organizations, projects and keys: the operations the admin API and the CLI share."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app import audit
from app.db.models import ApiKey, Organization, Project, utcnow
from app.db.timestamps import as_utc
from app.errors import Conflict, InvalidRequest, NotFound
from app.tenancy.keys import KeyHasher, same_digest
from app.tenancy.principal import Principal
from app.tenancy.roles import OWNER, PROJECT_ADMIN, checked_role
from app.text import path_name_problem, text_problem

DEFAULT_ORGANIZATION = "default"
# How far ahead a key may expire. Past it, times leave the range that Python and the databases
# share (PostgreSQL stores year 10000 in UTC, Python cannot read it back); no expiry means none.
MAX_KEY_LIFETIME = dt.timedelta(days=36524)  # 100 years


@dataclass(frozen=True)
class Actor:
    """Who makes an admin change, for the audit log."""

    name: str
    request_id: str | None = None


CLI = Actor("cli")


def normalize_allowlist(models: Any) -> list[str] | None:
    """"all" -> None; a list (or comma-separated string) of public names -> that list."""
    if models is None or models == "all":
        return None
    if isinstance(models, str):
        models = [m.strip() for m in models.split(",") if m.strip()]
    if not isinstance(models, list) or not all(isinstance(m, str) and m for m in models):
        raise InvalidRequest("models must be \"all\" or a list of public model names")
    for model in models:
        problem = text_problem(model)
        if problem is not None:
            raise InvalidRequest(f"a model name in models {problem}")
    return sorted(set(models))


def create_organization(session: Session, name: str, actor: Actor) -> Organization:
    _check_name(name, "organization")
    if session.scalar(select(Organization).where(Organization.name == name)):
        raise Conflict(f"organization '{name}' already exists")
    org = Organization(name=name)
    session.add(org)
    session.flush()
    audit.record(session, actor=actor.name, action="organization.create", target=f"organization:{name}",
                 request_id=actor.request_id)
    return org


def _organization(session: Session, name: str | None) -> Organization:
    name = name or DEFAULT_ORGANIZATION
    _check_name(name, "organization")
    org = session.scalar(select(Organization).where(Organization.name == name))
    if org is None:
        if name != DEFAULT_ORGANIZATION:
            raise NotFound(f"organization '{name}' does not exist; create it first")
        org = Organization(name=name)
        session.add(org)
        session.flush()
    return org


def create_project(session: Session, name: str, actor: Actor, *, models: Any = "all",
                   organization: str | None = None) -> Project:
    _check_name(name, "project")
    problem = path_name_problem(name)
    if problem is not None:
        raise InvalidRequest(f"a project name {problem}")
    allowed = normalize_allowlist(models)
    if session.scalar(select(Project).where(Project.name == name)):
        raise Conflict(f"project '{name}' already exists")
    org = _organization(session, organization)
    project = Project(name=name, organization_id=org.id, allowed_models=allowed, archived=False)
    session.add(project)
    try:
        session.flush()
    except IntegrityError as exc:
        raise Conflict(f"project '{name}' already exists") from exc
    audit.record(session, actor=actor.name, action="project.create", target=f"project:{name}",
                 request_id=actor.request_id, details={"models": allowed if allowed is not None else "all",
                                                       "organization": org.name})
    return project


def update_project(session: Session, name: str, actor: Actor, *, models: Any = None,
                   archived: bool | None = None, set_models: bool = False,
                   limits: dict[str, int | None] | None = None) -> Project:
    project = get_project(session, name)
    details: dict[str, Any] = {}
    for field, value in (limits or {}).items():
        setattr(project, field, _limit(field, value))
        details[field] = value
    if set_models:
        if models is None:
            raise InvalidRequest("models must be \"all\" or a list of public model names, not null")
        project.allowed_models = normalize_allowlist(models)
        details["models"] = project.allowed_models if project.allowed_models is not None else "all"
    if archived is not None:
        project.archived = archived
        details["archived"] = archived
    audit.record(session, actor=actor.name, action="project.update", target=f"project:{name}",
                 request_id=actor.request_id, details=details)
    return project


def get_project(session: Session, name: str) -> Project:
    project = session.scalar(select(Project).where(Project.name == name))
    if project is None:
        raise NotFound(f"project '{name}' does not exist")
    return project


def get_project_by_id(session: Session, project_id: int) -> Project:
    """Project ``project_id`` (an id from a UI page's URL); NotFound when it is gone."""
    project = session.get(Project, project_id) if 0 < project_id < 2**31 else None
    if project is None:
        raise NotFound(f"project {project_id} does not exist")
    return project


def list_projects(session: Session) -> list[Project]:
    return list(session.scalars(select(Project).order_by(Project.name)))


def create_key(session: Session, hasher: KeyHasher, actor: Actor, *, kind: str,
               project: str | None = None, name: str = "",
               expires_at: dt.datetime | None = None, role: str | None = None,
               projects: list[str] | None = None) -> tuple[ApiKey, str]:
    """A new key and its value (the only time the value exists outside the caller). An admin
    key has a ``role`` (omitted: owner) and, for a project-admin, the ``projects`` it manages."""
    if name:
        _check_name(name, "key")
    if kind != "admin" and (role is not None or projects):
        raise InvalidRequest("only admin keys have a role and projects")
    admin_role, managed = checked_role(role, projects) if kind == "admin" else (None, [])
    managed_ids = sorted(get_project(session, p).id for p in managed) or None
    project_id = None
    if kind == "project":
        if not project:
            raise InvalidRequest("a project key needs a project")
        project_obj = get_project(session, project)
        if project_obj.archived:
            raise InvalidRequest(f"project '{project}' is archived; unarchive it first")
        project_id = project_obj.id
    if expires_at is not None:
        expires_at = _expiry(expires_at)
    new = hasher.new(kind)
    key = ApiKey(kind=kind, project_id=project_id, name=name, digest=new.digest, prefix=new.prefix,
                 last_four=new.last_four, expires_at=expires_at, role=admin_role, admin_projects=managed_ids)
    session.add(key)
    session.flush()
    details: dict[str, Any] = {"project": project, "name": name,
                               "expires_at": expires_at.isoformat() if expires_at else None}
    if kind == "admin":
        details.update(role=admin_role, projects=managed)
    audit.record(session, actor=actor.name, action=f"{kind}_key.create",
                 target=f"key:{key.id}:{key.prefix}", request_id=actor.request_id, details=details)
    return key, new.value


def set_key_limits(session: Session, key_id: int, actor: Actor, limits: dict[str, int | None]) -> ApiKey:
    key = get_key(session, key_id)
    for field, value in limits.items():
        setattr(key, field, _limit(field, value))
    audit.record(session, actor=actor.name, action="key.update", target=f"key:{key.id}:{key.prefix}",
                 request_id=actor.request_id, details=dict(limits))
    return key


def _limit(field: str, value: int | None) -> int | None:
    if field not in ("requests_per_minute", "tokens_per_minute"):
        raise InvalidRequest(f"unknown limit {field!r}")
    if value is not None and not 1 <= value <= 10**12:
        raise InvalidRequest(f"{field} must be a positive number, or null for no limit")
    return value


def get_key(session: Session, key_id: int) -> ApiKey:
    if not 0 < key_id < 2**31:  # past the column's range: no such key (not a database error)
        raise NotFound(f"key {key_id} does not exist")
    key = session.get(ApiKey, key_id)
    if key is None:
        raise NotFound(f"key {key_id} does not exist")
    return key


def revoke_key(session: Session, key_id: int, actor: Actor, *, at: dt.datetime | None = None) -> ApiKey:
    key = get_key(session, key_id)
    revoked_at = _aware(key.revoked_at)
    if revoked_at is None or (at is None and revoked_at > utcnow()):
        key.revoked_at = at or utcnow()
    audit.record(session, actor=actor.name, action="key.revoke", target=f"key:{key.id}:{key.prefix}",
                 request_id=actor.request_id)
    return key


def rotate_key(session: Session, hasher: KeyHasher, key_id: int, actor: Actor, *,
               grace_seconds: int) -> tuple[ApiKey, str]:
    """A new key for the same project, with the old one's name, expiry and limits; the old one
    keeps working for ``grace_seconds``. A key is rotated once: a rotated (or revoked, or
    expired) key is a Conflict, so no grace period is ever extended."""
    if grace_seconds < 0 or grace_seconds > 30 * 86400:
        raise InvalidRequest("grace_seconds must be between 0 and 2592000 (30 days)")
    old = get_key(session, key_id)
    now = utcnow()
    if old.replaced_by_id is not None:
        raise Conflict(f"key {key_id} was rotated already (its successor is key {old.replaced_by_id}); "
                       "rotate that one")
    revoked_at, expires_at = _aware(old.revoked_at), _aware(old.expires_at)
    if revoked_at is not None and revoked_at <= now:
        raise Conflict(f"key {key_id} is revoked; create a new key instead")
    if expires_at is not None and expires_at <= now:
        raise Conflict(f"key {key_id} has expired; create a new key instead")
    project = session.get(Project, old.project_id) if old.project_id else None
    # An admin key's successor has its role and projects: a rotation never widens nor narrows it.
    role, managed = ((old.role or OWNER, admin_project_names(session, old))
                     if old.kind == "admin" else (None, None))
    new, value = create_key(session, hasher, actor, kind=old.kind,
                            project=project.name if project else None, name=old.name,
                            expires_at=expires_at, role=role, projects=managed)
    new.requests_per_minute, new.tokens_per_minute = old.requests_per_minute, old.tokens_per_minute
    grace_end = now + dt.timedelta(seconds=grace_seconds)
    if revoked_at is not None:  # a revocation already set for later is not postponed
        grace_end = min(grace_end, revoked_at)
    # Only if no other request rotated or revoked it since it was read (several replicas).
    claimed = session.execute(
        update(ApiKey).where(ApiKey.id == old.id, ApiKey.replaced_by_id.is_(None),
                             or_(ApiKey.revoked_at.is_(None), ApiKey.revoked_at > now))
        .values(revoked_at=grace_end, replaced_by_id=new.id)
        .execution_options(synchronize_session="fetch"))
    if claimed.rowcount != 1:  # type: ignore[attr-defined]  # a CursorResult
        raise Conflict(f"key {key_id} was rotated or revoked by another request just now")
    audit.record(session, actor=actor.name, action="key.rotate", target=f"key:{old.id}:{old.prefix}",
                 request_id=actor.request_id, details={"new_key": new.id, "grace_seconds": grace_seconds})
    return new, value


def list_keys(session: Session, *, project: str | None = None, kind: str | None = None) -> list[ApiKey]:
    query = select(ApiKey).order_by(ApiKey.id)
    if project is not None:
        query = query.where(ApiKey.project_id == get_project(session, project).id)
    if kind is not None:
        query = query.where(ApiKey.kind == kind)
    return list(session.scalars(query))


def project_name_of(session: Session, project_id: int) -> str | None:
    """The name of project ``project_id``; None for no such project."""
    project = session.get(Project, project_id) if 0 < project_id < 2**31 else None
    return project.name if project is not None else None


def project_of_key(session: Session, key_id: int) -> str | None:
    """The project of project key ``key_id``; None for an admin key or no such key."""
    key = session.get(ApiKey, key_id) if 0 < key_id < 2**31 else None
    return key_project_name(session, key) if key is not None and key.kind == "project" else None


def key_project_name(session: Session, key: ApiKey) -> str | None:
    project = session.get(Project, key.project_id) if key.project_id else None
    return project.name if project else None


def admin_project_names(session: Session, key: ApiKey) -> list[str]:
    """The names of the projects a project-admin key manages (none for another key)."""
    ids = [i for i in key.admin_projects or [] if isinstance(i, int)]
    if key.kind != "admin" or not ids:
        return []
    return sorted(session.scalars(select(Project.name).where(Project.id.in_(ids))))


def admin_key_view(session: Session, key: ApiKey) -> dict[str, Any]:
    """An admin key as the admin API shows it: a key's view with its role and projects."""
    return {**key_view(key), "role": key.role or OWNER, "projects": admin_project_names(session, key)}


def any_key_view(session: Session, key: ApiKey) -> dict[str, Any]:
    """A key of either kind as the admin API lists it: an admin key with its role and projects."""
    return admin_key_view(session, key) if key.kind == "admin" else key_view(key, key_project_name(session, key))


def key_view(key: ApiKey, project_name: str | None = None) -> dict[str, Any]:
    """A key as the admin API shows it: never its value or digest."""
    return {
        "id": key.id, "kind": key.kind, "name": key.name, "project": project_name,
        "prefix": key.prefix, "last_four": key.last_four,
        "created_at": _iso(key.created_at), "expires_at": _iso(key.expires_at),
        "revoked_at": _iso(key.revoked_at), "last_used_at": _iso(key.last_used_at),
        "replaced_by": key.replaced_by_id,
        "requests_per_minute": key.requests_per_minute, "tokens_per_minute": key.tokens_per_minute,
    }


def project_view(project: Project) -> dict[str, Any]:
    return {"id": project.id, "name": project.name,
            "models": project.allowed_models if project.allowed_models is not None else "all",
            "archived": project.archived, "requests_per_minute": project.requests_per_minute,
            "tokens_per_minute": project.tokens_per_minute, "created_at": _iso(project.created_at)}


def load_principal(session: Session, digest: str) -> Principal | None:
    """The principal behind a digest, for the key cache (a cache miss)."""
    row = session.execute(
        select(ApiKey, Project).outerjoin(Project, Project.id == ApiKey.project_id)
        .where(ApiKey.digest == digest)
    ).first()
    if row is None:
        return None
    key, project = row
    # The database found the row by its digest; confirm the match in constant time, whatever
    # the database's comparison (a collation, padding) would call equal.
    if not same_digest(digest, key.digest):
        return None
    return Principal(
        key_id=key.id, kind=key.kind, key_prefix=key.prefix,
        project_id=project.id if project else None,
        project_name=project.name if project else None,
        allowed_models=(frozenset(project.allowed_models)
                        if project is not None and project.allowed_models is not None else None),
        archived=bool(project.archived) if project else False,
        expires_at=_aware(key.expires_at), revoked_at=_aware(key.revoked_at),
        project_rpm=project.requests_per_minute if project else None,
        project_tpm=project.tokens_per_minute if project else None,
        key_rpm=key.requests_per_minute, key_tpm=key.tokens_per_minute,
        role=(key.role or OWNER) if key.kind == "admin" else None,
        admin_projects=(frozenset(admin_project_names(session, key))
                        if key.kind == "admin" and key.role == PROJECT_ADMIN else frozenset()),
    )


def principal_by_id(session: Session, key_id: int) -> Principal | None:
    """The principal of key ``key_id`` as the database has it now (the web UI re-checks its
    signed-in admin key with it on every request), or None for no such key."""
    key = session.get(ApiKey, key_id) if 0 < key_id < 2**31 else None
    return load_principal(session, key.digest) if key is not None else None


def any_admin_key(session: Session) -> bool:
    return session.scalar(select(ApiKey.id).where(ApiKey.kind == "admin").limit(1)) is not None


def key_registered(session: Session, hasher: KeyHasher, value: str) -> bool:
    """Whether the key ``value`` is in the database (whatever its state)."""
    return session.scalar(select(ApiKey.id).where(ApiKey.digest == hasher.digest(value))) is not None


def ensure_bootstrap_admin_key(session: Session, hasher: KeyHasher, value: str) -> bool:
    """Register ``value`` as an admin key when none exists yet (first start)."""
    if any_admin_key(session):
        return False
    if not value.startswith("arb_admin_") or len(value) < 30:
        raise InvalidRequest("ARBITER_BOOTSTRAP_ADMIN_KEY must start with 'arb_admin_' and be 30+ characters")
    key = ApiKey(kind="admin", digest=hasher.digest(value), prefix=value[:14], last_four=value[-4:],
                 name="bootstrap", role=OWNER)
    session.add(key)
    session.flush()
    audit.record(session, actor="environment", action="admin_key.create", target=f"key:{key.id}:{key.prefix}",
                 details={"name": "bootstrap", "role": OWNER})
    return True


def touch_keys(session: Session, last_used: dict[int, dt.datetime]) -> None:
    """Batched ``last_used_at`` writes, from the background writer. Only ever forward: another
    replica may have written a later use of the same key already."""
    for key_id, at in last_used.items():
        session.execute(update(ApiKey).where(
            ApiKey.id == key_id, or_(ApiKey.last_used_at.is_(None), ApiKey.last_used_at < at),
        ).values(last_used_at=at))


def _check_name(name: str, what: str) -> None:
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise InvalidRequest(f"a {what} name must be a non-empty string of at most 200 characters")
    problem = text_problem(name)
    if problem is not None:
        raise InvalidRequest(f"a {what} name {problem}")


def _expiry(value: dt.datetime) -> dt.datetime:
    """A key's expiry as stored: in UTC (SQLite keeps a time's digits and drops its zone, so
    14:00+05:00 stored as it is would read back as 14:00 UTC), in the future, at most
    MAX_KEY_LIFETIME ahead. No zone means UTC."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    ahead = value - utcnow()  # exact for any zone, even where the UTC time would leave Python's range
    if ahead <= dt.timedelta(0):
        raise InvalidRequest("expires_at is in the past; a key must expire in the future")
    if ahead > MAX_KEY_LIFETIME:
        raise InvalidRequest("expires_at is more than 100 years ahead; leave it out for a key that "
                             "does not expire")
    return value.astimezone(dt.UTC)


def _aware(value: dt.datetime | None) -> dt.datetime | None:
    return as_utc(value) if value is not None else None


def _iso(value: dt.datetime | None) -> str | None:
    value = _aware(value)
    return value.isoformat() if value else None
