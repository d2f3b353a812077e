"""Admin routes for organizations, projects and keys. Every change is audited by the domain."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from sqlalchemy.orm import Session

from app import audit
from app.api.admin.answers import (
    AdminKeyList,
    AnyKey,
    AuditLog,
    Key,
    KeyList,
    NewAdminKey,
    NewKey,
    NewOrganization,
    OrganizationList,
    OrganizationProjects,
    Project,
    ProjectList,
)
from app.api.admin.schemas import (
    AdminKeyCreate,
    KeyCreate,
    KeyRotate,
    KeyUpdate,
    OrganizationCreate,
    OrganizationRename,
    ProjectCreate,
    ProjectUpdate,
)
from app.api.deps import (
    AdminDep,
    AdminPrincipalDep,
    AdminRoute,
    ComponentsDep,
    needs,
    refuse_unless,
)
from app.api.documented import answer
from app.errors import InvalidRequest
from app.tenancy import organizations, roles
from app.tenancy import service as tenancy
from app.tenancy.roles import Need

router = APIRouter(prefix="/admin", route_class=AdminRoute)


@router.post("/organizations", dependencies=[needs(Need.OWNER)],
             **answer(NewOrganization, 201, {409: "an organization of that name exists"}))
async def create_organization(body: OrganizationCreate, actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    def work(s: Session) -> dict[str, Any]:
        org = tenancy.create_organization(s, body.name, actor)
        return {"id": org.id, "name": org.name}
    return await c.in_change(work)


@router.get("/organizations", dependencies=[needs(Need.READ)], **answer(OrganizationList))
async def list_organizations(_actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    """Every organization, each with its projects' names (a read of the whole gateway: a
    project-admin sees its projects through /admin/projects instead)."""
    return {"data": await c.in_session(organizations.list_organizations)}


# ``:path``: an organization's name may hold a '/' (organization names never had the rule of
# project names), and it is still reachable by its URL.
@router.get("/organizations/{name:path}", dependencies=[needs(Need.READ)], **answer(OrganizationProjects))
async def get_organization(name: str, _actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    return await c.in_session(lambda s: organizations.show_organization(s, name))


@router.patch("/organizations/{name:path}", dependencies=[needs(Need.OWNER)],
              **answer(OrganizationProjects, errors={409: "another organization has that name"}))
async def rename_organization(name: str, body: OrganizationRename, actor: AdminDep,
                              c: ComponentsDep) -> dict[str, Any]:
    """A new name for an organization (its projects follow it)."""
    return await c.in_change(lambda s: organizations.rename_organization(s, name, body.name, actor))


@router.get("/projects", dependencies=[needs(Need.SCOPED_READ)], **answer(ProjectList))
async def list_projects(who: AdminPrincipalDep, c: ComponentsDep) -> dict[str, Any]:
    """Every project; a project-admin's own projects only."""
    visible = roles.visible_projects(who)
    return {"data": await c.in_session(lambda s: [tenancy.project_view(p) for p in tenancy.list_projects(s)
                                                  if visible is None or p.name in visible])}


@router.post("/projects", dependencies=[needs(Need.OWNER)], **answer(Project, 201, {
    404: "the organization does not exist", 409: "a project of that name exists"}))
async def create_project(body: ProjectCreate, actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    return await c.in_change(lambda s: tenancy.project_view(tenancy.create_project(
        s, body.name, actor, models=body.models, organization=body.organization)))


@router.get("/projects/{name}", dependencies=[needs(Need.PROJECT_READ, "name")], **answer(Project))
async def get_project(name: str, _actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    return await c.in_session(lambda s: tenancy.project_view(tenancy.get_project(s, name)))


@router.patch("/projects/{name}", dependencies=[needs(Need.PROJECT_MANAGE, "name")], **answer(Project))
async def update_project(request: Request, name: str, body: ProjectUpdate, actor: AdminDep, who: AdminPrincipalDep,
                         c: ComponentsDep) -> dict[str, Any]:
    """A project's limits (a project-admin's too), its allowlist and archiving (an owner's only)."""
    if body.model_fields_set & {"models", "archived"}:
        await refuse_unless(request, who, Need.OWNER, None)
    limits: dict[str, int | None] = {f: getattr(body, f) for f in ("requests_per_minute", "tokens_per_minute")
                                     if f in body.model_fields_set}
    view = await c.in_change(lambda s: tenancy.project_view(tenancy.update_project(
        s, name, actor, models=body.models, archived=body.archived,
        set_models="models" in body.model_fields_set, limits=limits)))
    await c.changed_keys()
    return view


@router.get("/projects/{name}/keys", dependencies=[needs(Need.PROJECT_READ, "name")], **answer(KeyList))
async def list_project_keys(name: str, _actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    return {"data": await c.in_session(
        lambda s: [tenancy.key_view(k, name) for k in tenancy.list_keys(s, project=name)])}


@router.post("/projects/{name}/keys", dependencies=[needs(Need.PROJECT_MANAGE, "name")], **answer(NewKey, 201))
async def create_project_key(name: str, body: KeyCreate, actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    def work(s: Session) -> dict[str, Any]:
        key, value = tenancy.create_key(s, c.hasher, actor, kind="project", project=name,
                                        name=body.name, expires_at=body.expires_at)
        return {**tenancy.key_view(key, name), "key": value}
    return await c.in_change(work)


@router.get("/admin-keys", dependencies=[needs(Need.READ)], **answer(AdminKeyList))
async def list_admin_keys(_actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    return {"data": await c.in_session(
        lambda s: [tenancy.admin_key_view(s, k) for k in tenancy.list_keys(s, kind="admin")])}


@router.post("/admin-keys", dependencies=[needs(Need.OWNER)],
             **answer(NewAdminKey, 201, {404: "a project it names does not exist"}))
async def create_admin_key(body: AdminKeyCreate, actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    """An admin key with a role (omitted: owner, as its creator is) and, for a project-admin,
    the projects it manages. Only an owner gets here."""
    def work(s: Session) -> dict[str, Any]:
        key, value = tenancy.create_key(s, c.hasher, actor, kind="admin", name=body.name,
                                        expires_at=body.expires_at, role=body.role, projects=body.projects)
        return {**tenancy.admin_key_view(s, key), "key": value}
    return await c.in_change(work)


@router.get("/keys/{key_id}", dependencies=[needs(Need.KEY_READ, "key_id")], **answer(AnyKey))
async def get_key(key_id: int, _actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    """One key by id, of either kind, as its list shows it (a project-admin: its projects' keys)."""
    return await c.in_session(lambda s: tenancy.any_key_view(s, tenancy.get_key(s, key_id)))


@router.patch("/keys/{key_id}", dependencies=[needs(Need.KEY_MANAGE, "key_id")], **answer(Key))
async def update_key(key_id: int, body: KeyUpdate, actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    """A key's own limits (requests and tokens per minute; null: none)."""
    limits = body.model_dump(exclude_unset=True)
    view = await c.in_change(lambda s: tenancy.key_view(tenancy.set_key_limits(s, key_id, actor, limits)))
    await c.changed_keys()
    return view


@router.post("/keys/{key_id}/revoke", dependencies=[needs(Need.KEY_MANAGE, "key_id")], **answer(Key))
async def revoke_key(key_id: int, actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    def work(s: Session) -> dict[str, Any]:
        key = tenancy.revoke_key(s, key_id, actor)
        return tenancy.key_view(key, tenancy.key_project_name(s, key))
    view = await c.in_change(work)
    await c.changed_keys()
    return view


@router.post("/keys/{key_id}/rotate", dependencies=[needs(Need.KEY_MANAGE, "key_id")], **answer(NewKey, 201, {
    409: "the key was rotated already (rotate its successor), is revoked or has expired"}))
async def rotate_key(key_id: int, body: KeyRotate, actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    def work(s: Session) -> dict[str, Any]:
        key, value = tenancy.rotate_key(s, c.hasher, key_id, actor, grace_seconds=body.grace_seconds)
        return {**tenancy.key_view(key, tenancy.key_project_name(s, key)), "key": value}
    view = await c.in_change(work)
    await c.changed_keys()
    return view


@router.get("/audit", dependencies=[needs(Need.READ)], **answer(AuditLog))
async def audit_log(_actor: AdminDep, c: ComponentsDep, limit: int = 100,
                    before_id: Annotated[int | None, Query(ge=1, le=2**62)] = None,
                    actor: str = "", action: str = "", target: str = "") -> dict[str, Any]:
    """Newest first; ``actor`` and ``target`` keep entries holding that text (any case), ``action``
    one action or its dotted family (``project`` keeps ``project.create``), as the UI's filters."""
    limit = max(1, min(limit, 1000))
    filters = {"actor": actor.strip(), "action": action.strip(), "target": target.strip()}
    problem = audit.filter_problem(filters)
    if problem is not None:
        raise InvalidRequest(problem)
    chosen = {name: value or None for name, value in filters.items()}
    return {"data": await c.in_session(lambda s: audit.entries(s, limit=limit, before_id=before_id, **chosen))}
