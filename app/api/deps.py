"""Dependencies the routers share: the components, and who the caller is."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from app.components import Components
from app.tenancy.principal import Principal
from app.tenancy.service import Actor


def components(request: Request) -> Components:
    return request.app.state.components  # type: ignore[no-any-return]


async def project_principal(request: Request,
                            authorization: Annotated[str | None, Header()] = None) -> Principal:
    return await components(request).keys.authenticate(authorization, "project")


async def admin_actor(request: Request, authorization: Annotated[str | None, Header()] = None) -> Actor:
    principal = await components(request).keys.authenticate(authorization, "admin")
    return Actor(principal.actor, request.scope.get("state", {}).get("request_id"))


ComponentsDep = Annotated[Components, Depends(components)]
ProjectDep = Annotated[Principal, Depends(project_principal)]
AdminDep = Annotated[Actor, Depends(admin_actor)]
