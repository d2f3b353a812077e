"""The web UI's role checks: each page and form names the ``Need`` it has, as the admin API's
routes do, and a refusal is the same 403 ``permission_error``, audited the same way. The
templates hide what the signed-in key may not do (``admin.can(...)``); this refuses it anyway."""

from __future__ import annotations

from fastapi import Request

from app.api.deps import deny
from app.tenancy import roles
from app.tenancy import service as tenancy
from app.tenancy.roles import Need
from app.ui.web import Admin, components, signed_in


async def permitted(request: Request, need: Need, *, project_id: int | None = None,
                    key_id: int | None = None) -> Admin:
    """The signed-in admin, once its role allows ``need`` (on the project ``project_id``, or the
    project of key ``key_id``, for the project needs); else PermissionDenied (403, audited)."""
    admin = await signed_in(request)
    await check(request, admin, need, project=await _project_name(request, admin, project_id, key_id))
    return admin


async def check(request: Request, admin: Admin, need: Need, *, project: str | None = None) -> None:
    """PermissionDenied (403, audited) unless ``admin``'s role allows ``need`` on ``project``."""
    principal = admin.principal
    if principal is None:  # signed_in always sets it; without it nothing is allowed
        raise RuntimeError("the signed-in admin has no principal")
    reason = roles.refusal(principal, need, project)
    if reason is not None:
        route = request.scope.get("route")
        where = f"{request.method} {getattr(route, 'path', request.url.path)}"
        raise await deny(components(request), principal, reason, route=where, path=request.url.path,
                         request_id=request.scope.get("state", {}).get("request_id"))


async def _project_name(request: Request, admin: Admin, project_id: int | None, key_id: int | None) -> str | None:
    """The project a project-admin's request is about (only its role needs the name)."""
    if admin.principal is None or roles.role_of(admin.principal) != roles.PROJECT_ADMIN:
        return None
    if key_id is not None:
        return await components(request).in_session(lambda s: tenancy.project_of_key(s, key_id))
    if project_id is not None:
        return await components(request).in_session(lambda s: tenancy.project_name_of(s, project_id))
    return None
