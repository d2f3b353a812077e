"""Admin routes for services and models."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from sqlalchemy.orm import Session

from app.api.admin.answers import (
    MESH_WARNING,
    SERVICE_CHANGED,
    ModelList,
    NewService,
    Service,
    ServiceList,
    ServiceStatus,
)
from app.api.admin.schemas import ServiceCreate, ServiceUpdate
from app.api.deps import AdminDep, AdminRoute, ComponentsDep, needs
from app.api.documented import answer
from app.services import service as services
from app.services import sync
from app.tenancy.roles import Need

router = APIRouter(prefix="/admin", route_class=AdminRoute)


@router.get("/services", dependencies=[needs(Need.READ)], **answer(ServiceList))
async def list_services(_actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    views = await c.in_session(lambda s: [services.service_view(x) for x in services.list_services(s)])
    return {"data": [with_backoffs(v, c) for v in views]}


@router.post("/services", dependencies=[needs(Need.OPERATE)], **answer(NewService, 201, {
    400: "a bad field, or the backend cannot be reached or read",
    409: f"a service of that name exists; or {MESH_WARNING}"}))
async def add_service(body: ServiceCreate, actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    def answer(s: Session, service: Any) -> dict[str, Any]:
        models = [services.model_view(m, service) for m in services.service_models(s, service)]
        if not body.confirm:  # its models may be decision models: the mesh may warn (and nothing is added)
            c.mesh.check_decision_install(sorted({cap for m in models for cap in m["capabilities"]}))
        return {**services.service_view(service), "models": models}
    view = await services.add_service(c.in_change, c.settings, c.admin, actor, type=body.type, url=body.url,
                                      name=body.name, credential=body.api_key, text_limit=body.text_limit,
                                      timeout=body.timeout, context_length=body.context_length, then=answer)
    await c.changed_models()
    return with_backoffs(view, c)


@router.get("/services/{name}", dependencies=[needs(Need.READ)], **answer(ServiceStatus))
async def get_service(name: str, _actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    return with_backoffs(await c.in_session(lambda s: services.service_view(services.get_service(s, name))), c)


@router.patch("/services/{name}", dependencies=[needs(Need.OPERATE)],
              **answer(ServiceStatus, errors={409: SERVICE_CHANGED}))
async def update_service(name: str, body: ServiceUpdate, actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    changes = body.model_dump(exclude_unset=True)
    view = await services.update_service(c.in_change, c.settings, c.admin, name, actor, changes,
                                         then=lambda _s, service: services.service_view(service))
    await c.changed_models()
    return with_backoffs(view, c)


def with_backoffs(view: dict[str, Any], c: Any) -> dict[str, Any]:
    """A service's status with its replicas that sit out a back-off right now."""
    view["backed_off"] = [b for b in c.router.backed_off() if b["service_id"] == view["id"]]
    return view


@router.delete("/services/{name}", dependencies=[needs(Need.OPERATE)], **answer(None, 204))
async def remove_service(name: str, actor: AdminDep, c: ComponentsDep) -> None:
    await c.in_change(lambda s: services.remove_service(s, name, actor))
    await c.changed_models()


@router.post("/services/{name}/refresh", dependencies=[needs(Need.OPERATE)],
             **answer(Service, errors={409: SERVICE_CHANGED}))
async def refresh_service(name: str, actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    view = await sync.refresh(c.in_change, c.settings, c.admin, lambda s: services.get_service(s, name), actor,
                              then=lambda _s, service: services.service_view(service))
    await c.changed_models()
    return view


@router.get("/services/{name}/models", dependencies=[needs(Need.READ)], **answer(ModelList))
async def list_service_models(name: str, _actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    def work(s: Session) -> list[dict[str, Any]]:
        service = services.get_service(s, name)
        return [services.model_view(m, service) for m in services.service_models(s, service)]
    return {"data": await c.in_session(work)}


@router.get("/models", dependencies=[needs(Need.READ)], **answer(ModelList))
async def list_models(_actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    return {"data": await c.in_session(lambda s: [services.model_view(m, x) for m, x in services.all_models(s)])}
