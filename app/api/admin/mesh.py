"""Admin routes for the mesh: its state, and peers added or removed at run time."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter

from app.api.admin.answers import MeshStatus, NewMeshPeer
from app.api.admin.schemas import MeshPeerCreate
from app.api.deps import AdminDep, AdminRoute, ComponentsDep, needs
from app.api.documented import answer
from app.tenancy.roles import Need

router = APIRouter(prefix="/admin", route_class=AdminRoute)


@router.get("/mesh", dependencies=[needs(Need.READ)], **answer(MeshStatus))
async def mesh_status(_actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    """This node, its peers (versions, models, last contact, errors) and refused connections."""
    return c.mesh.status()


@router.post("/mesh/peers", dependencies=[needs(Need.OPERATE)], **answer(NewMeshPeer, 201, {
    400: "a bad URL, or this node is not in a mesh (ARBITER_MESH_KEY is not set)",
    409: "that peer is added already"}))
async def add_peer(body: MeshPeerCreate, actor: AdminDep, c: ComponentsDep) -> dict[str, Any]:
    peer = await asyncio.to_thread(c.mesh.add_peer, body.url, actor)
    await c.changed_mesh_peers()
    return peer


@router.delete("/mesh/peers/{peer_id}", dependencies=[needs(Need.OPERATE)], **answer(None, 204))
async def remove_peer(peer_id: int, actor: AdminDep, c: ComponentsDep) -> None:
    await asyncio.to_thread(c.mesh.remove_peer, peer_id, actor)
    await c.changed_mesh_peers()
