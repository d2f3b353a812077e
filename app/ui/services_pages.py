"""Services: their status, add, change, refresh and remove. The same domain calls, audit
records and change notifications as the admin API's routes (app/api/admin/services.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from sqlalchemy.orm import Session

from app.api.admin.schemas import ServiceCreate, ServiceUpdate
from app.api.admin.services import with_backoffs
from app.errors import InvalidRequest
from app.routing.backends import SERVICE_TYPES
from app.services import service as services
from app.services import sync
from app.tenancy import roles
from app.tenancy.roles import Need
from app.ui.roles import check, permitted
from app.ui.web import (
    FORM_ERRORS,
    Admin,
    Form,
    UiRoute,
    components,
    decimal,
    drop_blank,
    is_mesh_warning,
    mesh_check,
    mesh_warning,
    message,
    posted,
    redirect,
    render,
    signed_in,
    validated,
    whole,
)

router = APIRouter(route_class=UiRoute)
NOTICES = {"added": "Service added; its version and models were read.", "removed": "Service removed.",
           "changed": "Service changed.", "refreshed": "Version and models read again.",
           "key-dropped": "Service changed. Its new URL is on another host, port or scheme, so its stored API key "
                          "was dropped (a key goes only where it was given for): give the key again if the "
                          "backend there needs one."}


def _service_name(s: Session, service_id: int) -> str:
    return services.get_service_by_id(s, service_id).name


def _name_and_key(s: Session, service_id: int) -> tuple[str, bool]:
    service = services.get_service_by_id(s, service_id)
    return service.name, service.credential is not None


async def _list(request: Request, admin: Admin, *, status: int = 200, error: str | None = None,
                values: dict[str, str] | None = None, done: str = "",
                warning: dict[str, Any] | None = None) -> Response:
    c = components(request)
    views = await c.in_session(lambda s: [services.service_view(x) for x in services.list_services(s)])
    return render(request, "services.html", admin, status=status, services=[with_backoffs(v, c) for v in views],
                  types=SERVICE_TYPES, errors={"add-service": error} if error else {}, values=values or {},
                  notice=NOTICES.get(done),
                  warning=warning)


@router.get("/services")
async def list_page(request: Request, done: str = "") -> Response:
    admin = await signed_in(request)
    if admin.principal is not None and roles.role_of(admin.principal) == roles.PROJECT_ADMIN:
        return redirect("/ui/projects")  # the UI's home; a project-admin's is its projects
    await check(request, admin, Need.READ)
    return await _list(request, admin, done=done)


@router.post("/services")
async def add(request: Request) -> Response:
    admin = await permitted(request, Need.OPERATE)
    form = await posted(request, admin)
    c = components(request)
    try:
        body = validated(ServiceCreate, drop_blank({
            "type": form.get("type"), "url": form.get("url") or None, "name": form.get("name") or None,
            "api_key": form.get("api_key") or None, "text_limit": whole(form, "text_limit", "Text limit"),
            "timeout": decimal(form, "timeout", "Timeout"),
            "context_length": whole(form, "context_length", "Context length"),
            "confirm": form.get("confirm") == "true"}))  # "Add anyway", after the mesh warning

        def warn(s: Session, service: Any) -> None:
            if not body.confirm:  # as POST /admin/services: its decision models may make the mesh warn
                models = [services.model_view(m, service) for m in services.service_models(s, service)]
                mesh_check(c, sorted({cap for m in models for cap in m["capabilities"]}))
        await services.add_service(c.in_session, c.settings, c.admin, admin.actor, type=body.type, url=body.url,
                                   name=body.name, credential=body.api_key, text_limit=body.text_limit,
                                   timeout=body.timeout, context_length=body.context_length, then=warn)
    except FORM_ERRORS as exc:
        values = {k: v for k, v in form.values().items() if k != "api_key"}  # a secret is never sent back
        if is_mesh_warning(exc):
            # The API key is not sent back either: the admin types it again above "Add anyway".
            return await _list(request, admin, status=409, values=values, warning=mesh_warning(
                exc, "/ui/services", "Add anyway", "/ui/services", values,
                secret="api_key" if form.get("api_key") else ""))
        return await _list(request, admin, status=400, error=message(exc), values=values)
    await c.changed_models()
    return redirect("/ui/services?done=added")


async def _detail(request: Request, admin: Admin, service_id: int, *, status: int = 200,
                  errors: dict[str, str] | None = None, done: str = "",
                  values: dict[str, str] | None = None) -> Response:
    c = components(request)

    def work(s: Session) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        service = services.get_service_by_id(s, service_id)
        return (services.service_view(service),
                [services.model_view(m, service) for m in services.service_models(s, service)])
    view, models = await c.in_session(work)
    return render(request, "service.html", admin, status=status, service=with_backoffs(view, c), models=models,
                  ollama=view["type"] in sync.OLLAMA_TYPES, errors=errors or {}, notice=NOTICES.get(done),
                  values=values or {})


@router.get("/services/{service_id}")
async def detail_page(request: Request, service_id: int, done: str = "") -> Response:
    return await _detail(request, await permitted(request, Need.READ), service_id, done=done)


@router.post("/services/{service_id}")
async def change(request: Request, service_id: int) -> Response:
    admin = await permitted(request, Need.OPERATE)
    form = await posted(request, admin)
    c = components(request)
    try:
        changes = validated(ServiceUpdate, _changes(form)).model_dump(exclude_unset=True)
        if form.get("clear_api_key"):
            changes["api_key"] = None
        if form.get("clear_version_override"):
            changes["version_override"] = None
        if not changes:
            raise InvalidRequest("Nothing to change: fill in a field (blank fields stay as they are)")
        name, keyed = await c.in_session(lambda s: _name_and_key(s, service_id))
        dropped = await services.update_service(c.in_session, c.settings, c.admin, name, admin.actor, changes,
                                                then=lambda _s, service: keyed and service.credential is None)
    except FORM_ERRORS as exc:
        typed = {k: v for k, v in form.values().items() if k != "api_key"}  # a secret is never sent back
        return await _detail(request, admin, service_id, status=400, errors={"change": message(exc)}, values=typed)
    await c.changed_models()
    done = "key-dropped" if dropped and "api_key" not in changes else "changed"
    return redirect(f"/ui/services/{service_id}?done={done}")


@router.post("/services/{service_id}/refresh")
async def refresh(request: Request, service_id: int) -> Response:
    admin = await permitted(request, Need.OPERATE)
    await posted(request, admin)
    c = components(request)

    def outcome(_s: Session, service: Any) -> str | None:
        return None if service.reachable else (service.last_error or "the service did not answer")
    try:
        failed = await sync.refresh(c.in_session, c.settings, c.admin,
                                    lambda s: services.get_service_by_id(s, service_id), admin.actor, then=outcome)
    except FORM_ERRORS as exc:
        return await _detail(request, admin, service_id, status=400, errors={"refresh": message(exc)})
    await c.changed_models()
    if failed is not None:  # the read failed: say so, not "read again"
        return await _detail(request, admin, service_id, status=502,
                             errors={"refresh": f"Could not read the service: {failed}"})
    return redirect(f"/ui/services/{service_id}?done=refreshed")


@router.post("/services/{service_id}/delete")
async def remove(request: Request, service_id: int) -> Response:
    admin = await permitted(request, Need.OPERATE)
    await posted(request, admin)
    c = components(request)
    try:
        await c.in_session(lambda s: services.remove_service(s, _service_name(s, service_id), admin.actor))
    except FORM_ERRORS as exc:
        return await _detail(request, admin, service_id, status=400, errors={"remove": message(exc)})
    await c.changed_models()
    return redirect("/ui/services?done=removed")


def _changes(form: Form) -> dict[str, Any]:
    return drop_blank({
        "url": form.get("url") or None, "api_key": form.get("api_key") or None,
        "text_limit": whole(form, "text_limit", "Text limit"), "timeout": decimal(form, "timeout", "Timeout"),
        "context_length": whole(form, "context_length", "Context length"),
        "version_override": form.get("version_override") or None})
