"""Admin routes for the catalog, installs, model cards and their Test action."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from app.api.admin import testing
from app.api.admin.answers import (
    MESH_WARNING,
    SERVICE_CHANGED,
    Catalog,
    Install,
    InstallList,
    ModelCard,
    ModelTestResult,
)
from app.api.admin.schemas import ModelInstallRequest, ModelUpdate
from app.api.deps import AdminDep, AdminRoute, ComponentsDep, needs
from app.api.documented import answer
from app.services import catalog
from app.services import service as services
from app.tenancy.roles import Need

router = APIRouter(prefix="/admin", route_class=AdminRoute)


@router.get("/catalog", dependencies=[needs(Need.READ)], **answer(Catalog))
async def list_catalog(_actor: AdminDep) -> dict[str, Any]:
    return {"data": [m.view() for m in catalog.entries()]}


@router.post("/services/{name}/models", dependencies=[needs(Need.OPERATE)], **answer(
    Install, 202, {409: f"the model is installed, or being installed, already; or {MESH_WARNING}; "
                        f"or {SERVICE_CHANGED}"},
    also={201: (ModelCard, "a vLLM, OpenAI-compatible or Ollama Cloud service: the model, registered at once")}))
async def install_model(name: str, body: ModelInstallRequest, actor: AdminDep, c: ComponentsDep) -> JSONResponse:
    """Install a catalog model, or a custom one with its capabilities. An Ollama pulls it (202 and an
    install to follow); a vLLM or Ollama Cloud service registers it at once (201)."""
    guard = None if body.confirm else c.mesh.check_decision_install
    status, view = await c.installer.install(name, body.model_dump(exclude_none=True, exclude={"confirm"}),
                                             actor, guard)
    return JSONResponse(view, status_code=status)


@router.delete("/services/{name}/models/{model:path}", dependencies=[needs(Need.OPERATE)],
               **answer(None, 204, {409: SERVICE_CHANGED}))
async def uninstall_model(name: str, model: str, actor: AdminDep, c: ComponentsDep) -> None:
    await c.installer.uninstall(name, model, actor)


@router.get("/installs", dependencies=[needs(Need.READ)], **answer(InstallList))
async def list_installs(_actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    return {"data": await c.installer.recent()}


@router.get("/installs/{install_id}", dependencies=[needs(Need.READ)], **answer(Install))
async def get_install(install_id: int, _actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    return await c.installer.get(install_id)


@router.post("/installs/{install_id}/cancel", dependencies=[needs(Need.OPERATE)],
             **answer(Install, errors={409: "the install has finished already"}))
async def cancel_install(install_id: int, actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    return await c.installer.cancel(install_id, actor)


@router.get("/models/{model_id}", dependencies=[needs(Need.READ)], **answer(ModelCard))
async def get_model(model_id: int, _actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    return await c.in_session(lambda s: services.model_view(*services.get_model(s, model_id)))


@router.patch("/models/{model_id}", dependencies=[needs(Need.OPERATE)],
              **answer(ModelCard, errors={409: MESH_WARNING}))
async def update_model(model_id: int, body: ModelUpdate, actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    changes = body.model_dump(exclude_unset=True, exclude={"confirm"})
    guard = None if body.confirm else c.mesh.check_decision_install  # label reading makes a decision model
    view = await c.in_change(lambda s: services.model_view(*services.update_model(s, model_id, actor, changes,
                                                                                  guard)))
    await c.changed_models()
    return view


@router.post("/models/{model_id}/test", dependencies=[needs(Need.OPERATE)], **answer(ModelTestResult))
async def test_model(model_id: int, actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    public_name, service_id, capabilities = await c.in_session(lambda s: services.card_target(s, model_id))
    return await testing.run(c.forwarder, c.chat, c.observer, public_name=public_name, service_id=service_id,
                             capabilities=capabilities, request_id=actor.request_id)
