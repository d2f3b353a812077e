"""Admin routes for the mesh: its state, and peers added or removed at run time."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter

from app.api.admin.schemas import MeshPeerCreate
from app.api.deps import AdminDep, AdminRoute, ComponentsDep, needs
from app.tenancy.roles import Need

router = APIRouter(prefix="/admin", route_class=AdminRoute)


@router.get("/mesh", dependencies=[needs(Need.READ)])
async def mesh_status(_actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    """This node, its peers (versions, models, last contact, errors) and refused connections."""
    return c.mesh.status()


@router.post("/mesh/peers", status_code=201, dependencies=[needs(Need.OPERATE)])
async def add_peer(body: MeshPeerCreate, actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    peer = await asyncio.to_thread(c.mesh.add_peer, body.url, actor)
    await c.changed_mesh_peers()
    return peer


@router.delete("/mesh/peers/{peer_id}", status_code=204, dependencies=[needs(Need.OPERATE)])
async def remove_peer(peer_id: int, actor: AdminDep, c: ComponentsDep) -> None:
    await asyncio.to_thread(c.mesh.remove_peer, peer_id, actor)
    await c.changed_mesh_peers()
