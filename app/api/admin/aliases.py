"""Admin routes for model aliases (SPEC §1): a second public name for a model, shared by every
replica through the database and resolved in memory (app/services/aliases.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from app.api.admin.answers import Alias, AliasList
from app.api.admin.schemas import AliasCreate
from app.api.deps import AdminDep, AdminRoute, ComponentsDep, needs
from app.api.documented import answer
from app.services import aliases
from app.tenancy.roles import Need

router = APIRouter(prefix="/admin", route_class=AdminRoute)


@router.get("/aliases", dependencies=[needs(Need.READ)], **answer(AliasList))
async def list_aliases(_actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    """Every alias with its status: active, shadowed (a model of its name wins) or target_missing."""
    is_model = c.registry.known
    return {"data": await c.in_session(lambda s: [aliases.alias_view(a, is_model)
                                                  for a in aliases.list_aliases(s)])}


@router.post("/aliases", dependencies=[needs(Need.OPERATE)], **answer(Alias, 201, {
    400: "a bad name, a target that is not installed or is an alias itself, or a name an alias points at",
    409: "an alias of that name exists, or a model has the name"}))
async def create_alias(body: AliasCreate, actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    known = c.registry.known  # a model of the mesh counts, as one installed here
    view = await c.in_change(lambda s: aliases.alias_view(aliases.create_alias(s, actor, body.alias, body.model,
                                                                               known), known))
    await c.changed_models()  # here at once, on other replicas through the change bus
    return view


@router.delete("/aliases/{alias:path}", dependencies=[needs(Need.OPERATE)], **answer(None, 204))
async def remove_alias(alias: str, actor: AdminDep, c: ComponentsDep) -> None:
    await c.in_change(lambda s: aliases.remove_alias(s, actor, alias))
    await c.changed_models()
