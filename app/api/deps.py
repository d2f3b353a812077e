"""Dependencies the routers share: the components, who the caller is, and what its role allows."""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import Depends, Header, Request, Response
from fastapi.params import Depends as DependsParam
from fastapi.routing import APIRoute
from sqlalchemy.exc import SQLAlchemyError

from app import audit
from app.components import Components
from app.errors import InvalidRequest, PermissionDenied
from app.tenancy import roles
from app.tenancy import service as tenancy
from app.tenancy.principal import Principal
from app.tenancy.roles import Need
from app.tenancy.service import Actor
from app.text import ascii_digits

log = logging.getLogger("arbiter.admin")


def components(request: Request) -> Components:
    return request.app.state.components  # type: ignore[no-any-return]


# The key is the operation's security requirement in the OpenAPI document (app/api/openapi.py),
# not a header parameter of its own.
Authorization = Annotated[str | None, Header(include_in_schema=False)]


async def project_principal(request: Request, authorization: Authorization = None) -> Principal:
    return await components(request).keys.authenticate(authorization, "project")


async def admin_actor(request: Request, authorization: Authorization = None) -> Actor:
    principal = await components(request).keys.authenticate(authorization, "admin")
    return Actor(principal.actor, request.scope.get("state", {}).get("request_id"))


class Permission:
    """What an admin route needs of the caller's role (``dependencies=[needs(...)]``). AdminRoute
    checks it, before FastAPI reads the body; as a dependency it gives the checked principal.
    ``project`` names the path parameter that holds the project (or, for ``KEY_MANAGE`` and
    ``KEY_READ``, the key id) that a project-admin must manage."""

    def __init__(self, need: Need, project: str | None = None) -> None:
        self.need = need
        self.project = project

    async def __call__(self, request: Request) -> Principal:
        return await admin_principal(request)


def needs(need: Need, project: str | None = None) -> Any:
    """A route's permission, for its ``dependencies``."""
    return Depends(Permission(need, project))


async def admin_principal(request: Request) -> Principal:
    """The admin principal AdminRoute checked for this request."""
    principal = request.scope.get("state", {}).get("admin_principal")
    if principal is None:  # not behind AdminRoute: authenticate here
        principal = await components(request).keys.authenticate(request.headers.get("authorization"), "admin")
    return principal  # type: ignore[no-any-return]


async def deny(c: Components, principal: Principal, reason: str, *, route: str, path: str,
               request_id: str | None) -> PermissionDenied:
    """Audit a refusal (in a transaction of its own, so it is kept) and give the 403 to raise.
    Folded (app/audit.py): a key's refusals on one route within a minute are one entry with a
    count, the first one's path (cut to 512 characters) in its details."""
    details = {"role": roles.role_of(principal), "path": path, "reason": reason}
    try:
        await c.in_session(lambda s: audit.fold(s, actor=principal.actor, action=roles.DENIED_ACTION,
                                                target=f"route:{route}", request_id=request_id,
                                                details=details))
    except SQLAlchemyError as exc:  # the refusal stands; the log says it went unrecorded
        log.error("a refused admin request could not be audited: %s", type(exc).__name__)
    return PermissionDenied(f"{reason}; ask an owner for a key with that role")


async def check(request: Request, principal: Principal, permission: Permission, route: str) -> None:
    """PermissionDenied (403, audited) unless ``principal``'s role allows ``permission`` here."""
    c = components(request)
    scope = request.path_params.get(permission.project) if permission.project else None
    if permission.need in (Need.KEY_MANAGE, Need.KEY_READ) and scope is not None:
        scope = await _key_project(c, principal, str(scope))
    reason = roles.refusal(principal, permission.need, scope)
    if reason is not None:
        raise await deny(c, principal, reason, route=route, path=request.url.path,
                         request_id=request.scope.get("state", {}).get("request_id"))


async def refuse_unless(request: Request, principal: Principal, need: Need, project: str | None) -> None:
    """The same check from inside a handler, for what only the body or the query names."""
    route = request.scope.get("route")
    where = f"{request.method} {getattr(route, 'path', request.url.path)}"
    reason = roles.refusal(principal, need, project)
    if reason is not None:
        raise await deny(components(request), principal, reason, route=where, path=request.url.path,
                         request_id=request.scope.get("state", {}).get("request_id"))


async def _key_project(c: Components, principal: Principal, raw: str) -> str | None:
    """The project of key ``raw`` (a project key's), for a project-admin; None for an admin key
    or no such key (refused alike: a project-admin cannot probe which keys exist). Other roles
    are decided without the database. An id that is no number at all ("²") is a 400 for every
    role, as the route's own check answers it for the others: no key can have it."""
    if roles.role_of(principal) != roles.PROJECT_ADMIN:
        return None
    if not raw.isascii() or not raw.isdigit():
        raise InvalidRequest(f"a key id is a whole number, as the key lists show it, not {raw[:40]!r}")
    if not ascii_digits(raw) or int(raw) >= 2**31:  # more than a key id holds (int() reads 4,300 digits)
        return None
    return await c.in_session(lambda s: tenancy.project_of_key(s, int(raw)))


class AdminRoute(APIRoute):
    """An admin route checks the key, then its role's permission (``needs(...)`` among its
    dependencies, required of every admin route), before FastAPI reads the body: a caller
    without an admin key gets 401, one whose role may not gets 403, never a 400 about a body it
    may not send."""

    @property
    def permission(self) -> Permission:
        """The route's declared permission; a route without one is refused when it is built."""
        declared = [d.dependency for d in self.dependencies
                    if isinstance(d, DependsParam) and isinstance(d.dependency, Permission)]
        if len(declared) != 1:
            raise TypeError(f"admin route {self.path} must declare one permission: dependencies=[needs(Need...)]")
        return declared[0]

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        permission = self.permission
        route = f"{'/'.join(sorted(self.methods or ()))} {self.path}"

        async def authenticated(request: Request) -> Response:
            principal = await components(request).keys.authenticate(request.headers.get("authorization"), "admin")
            request.scope.setdefault("state", {})["admin_principal"] = principal
            await check(request, principal, permission, route)
            return await handler(request)

        return authenticated


ComponentsDep = Annotated[Components, Depends(components)]
ProjectDep = Annotated[Principal, Depends(project_principal)]
AdminDep = Annotated[Actor, Depends(admin_actor)]
AdminPrincipalDep = Annotated[Principal, Depends(admin_principal)]
