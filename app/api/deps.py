"""Dependencies the routers share: the components, and who the caller is."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import Depends, Header, Request, Response
from fastapi.routing import APIRoute

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


class AdminRoute(APIRoute):
    """An admin route checks the key before FastAPI reads the body, so a caller without an
    admin key gets 401, never a 400 about a body it may not send."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def authenticated(request: Request) -> Response:
            await components(request).keys.authenticate(request.headers.get("authorization"), "admin")
            return await handler(request)

        return authenticated


ComponentsDep = Annotated[Components, Depends(components)]
ProjectDep = Annotated[Principal, Depends(project_principal)]
AdminDep = Annotated[Actor, Depends(admin_actor)]
