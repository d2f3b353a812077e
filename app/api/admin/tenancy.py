"""Admin routes for organizations, projects and keys. Every change is audited by the domain."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from sqlalchemy.orm import Session

from app import audit
from app.api.admin.schemas import (
    KeyCreate,
    KeyRotate,
    KeyUpdate,
    OrganizationCreate,
    ProjectCreate,
    ProjectUpdate,
)
from app.api.deps import AdminDep, AdminRoute, ComponentsDep
from app.tenancy import service as tenancy

router = APIRouter(prefix="/admin", route_class=AdminRoute)


@router.post("/organizations", status_code=201)
async def create_organization(body: OrganizationCreate, actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    def work(s: Session) -> dict[str, Any]:
        org = tenancy.create_organization(s, body.name, actor)
        return {"id": org.id, "name": org.name}
    return await c.in_change(work)


@router.get("/projects")
async def list_projects(_actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    return {"data": await c.in_session(lambda s: [tenancy.project_view(p) for p in tenancy.list_projects(s)])}


@router.post("/projects", status_code=201)
async def create_project(body: ProjectCreate, actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    return await c.in_change(lambda s: tenancy.project_view(tenancy.create_project(
        s, body.name, actor, models=body.models, organization=body.organization)))


@router.get("/projects/{name}")
async def get_project(name: str, _actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    return await c.in_session(lambda s: tenancy.project_view(tenancy.get_project(s, name)))


@router.patch("/projects/{name}")
async def update_project(name: str, body: ProjectUpdate, actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    limits: dict[str, int | None] = {f: getattr(body, f) for f in ("requests_per_minute", "tokens_per_minute")
                                     if f in body.model_fields_set}
    view = await c.in_change(lambda s: tenancy.project_view(tenancy.update_project(
        s, name, actor, models=body.models, archived=body.archived,
        set_models="models" in body.model_fields_set, limits=limits)))
    await c.changed_keys()
    return view


@router.get("/projects/{name}/keys")
async def list_project_keys(name: str, _actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    return {"data": await c.in_session(
        lambda s: [tenancy.key_view(k, name) for k in tenancy.list_keys(s, project=name)])}


@router.post("/projects/{name}/keys", status_code=201)
async def create_project_key(name: str, body: KeyCreate, actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    def work(s: Session) -> dict[str, Any]:
        key, value = tenancy.create_key(s, c.hasher, actor, kind="project", project=name,
                                        name=body.name, expires_at=body.expires_at)
        return {**tenancy.key_view(key, name), "key": value}
    return await c.in_change(work)


@router.get("/admin-keys")
async def list_admin_keys(_actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    return {"data": await c.in_session(lambda s: [tenancy.key_view(k) for k in tenancy.list_keys(s, kind="admin")])}


@router.post("/admin-keys", status_code=201)
async def create_admin_key(body: KeyCreate, actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    def work(s: Session) -> dict[str, Any]:
        key, value = tenancy.create_key(s, c.hasher, actor, kind="admin", name=body.name,
                                        expires_at=body.expires_at)
        return {**tenancy.key_view(key), "key": value}
    return await c.in_change(work)


@router.patch("/keys/{key_id}")
async def update_key(key_id: int, body: KeyUpdate, actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    """A key's own limits (requests and tokens per minute; null: none)."""
    limits = body.model_dump(exclude_unset=True)
    view = await c.in_change(lambda s: tenancy.key_view(tenancy.set_key_limits(s, key_id, actor, limits)))
    await c.changed_keys()
    return view


@router.post("/keys/{key_id}/revoke")
async def revoke_key(key_id: int, actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    def work(s: Session) -> dict[str, Any]:
        key = tenancy.revoke_key(s, key_id, actor)
        return tenancy.key_view(key, tenancy.key_project_name(s, key))
    view = await c.in_change(work)
    await c.changed_keys()
    return view


@router.post("/keys/{key_id}/rotate", status_code=201)
async def rotate_key(key_id: int, body: KeyRotate, actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    def work(s: Session) -> dict[str, Any]:
        key, value = tenancy.rotate_key(s, c.hasher, key_id, actor, grace_seconds=body.grace_seconds)
        return {**tenancy.key_view(key, tenancy.key_project_name(s, key)), "key": value}
    view = await c.in_change(work)
    await c.changed_keys()
    return view


@router.get("/audit")
async def audit_log(_actor: AdminDep, c: ComponentsDep, limit: int = 100,
                    before_id: Annotated[int | None, Query(ge=1, le=2**62)] = None) -> dict[str, Any]:
    limit = max(1, min(limit, 1000))
    return {"data": await c.in_session(lambda s: audit.entries(s, limit=limit, before_id=before_id))}
