"""Projects and their keys: create, allowlists, limits, archive, keys shown once, revoke. The
same calls as app/api/admin/tenancy.py, with its change notifications."""

from __future__ import annotations

import datetime as dt
from typing import Any

from fastapi import APIRouter, Request, Response
from sqlalchemy.orm import Session

from app.api.admin.schemas import KeyCreate, KeyRotate, ProjectCreate, ProjectUpdate
from app.errors import InvalidRequest
from app.services import service as services
from app.tenancy import roles
from app.tenancy import service as tenancy
from app.tenancy.roles import Need
from app.ui.roles import permitted
from app.ui.shelf import COOKIE as SHELF_COOKIE
from app.ui.shelf import SHELF_SECONDS
from app.ui.web import (
    FORM_ERRORS,
    Admin,
    Form,
    UiRoute,
    components,
    message,
    posted,
    redirect,
    render,
    ui_state,
    validated,
    whole,
)

router = APIRouter(route_class=UiRoute)
NOTICES = {"created": "Project created.", "models": "Allowlist saved.", "limits": "Limits saved.",
           "archived": "Project archived: its keys get 403 until it is unarchived.",
           "unarchived": "Project unarchived.", "revoked": "Key revoked: requests with it now get 401.",
           "key": "Key created.", "rotated": "Key rotated.",
           "shown": "The new key was shown once already; it is not shown again."}


def _project_name(s: Session, project_id: int) -> str:
    return tenancy.get_project_by_id(s, project_id).name


def _model_names(s: Session) -> list[str]:
    return sorted({m.public_name for m, _ in services.all_models(s)})


@router.get("/projects")
async def list_page(request: Request) -> Response:
    return await _list(request, await permitted(request, Need.SCOPED_READ))


async def _list(request: Request, admin: Admin, *, status: int = 200, error: str | None = None,
                values: dict[str, str] | None = None, current: Any = "all") -> Response:
    visible = roles.visible_projects(admin.principal) if admin.principal is not None else frozenset()

    def work(s: Session) -> tuple[list[dict[str, Any]], list[str]]:
        return ([tenancy.project_view(p) for p in tenancy.list_projects(s) if visible is None or p.name in visible],
                _model_names(s))
    projects, names = await components(request).in_session(work)
    chosen = current if isinstance(current, list) else []
    return render(request, "projects.html", admin, status=status, projects=projects,
                  model_names=sorted(set(names) | set(chosen)), errors={"create-project": error} if error else {},
                  values=values or {}, current=current)


@router.post("/projects")
async def create(request: Request) -> Response:
    admin = await permitted(request, Need.OWNER)
    form = await posted(request, admin)
    try:
        body = validated(ProjectCreate, {"name": form.get("name"), "models": _allowlist(form),
                                         "organization": form.get("organization") or None})
        project_id = await components(request).in_session(lambda s: tenancy.create_project(
            s, body.name, admin.actor, models=body.models, organization=body.organization).id)
    except FORM_ERRORS as exc:
        # The allowlist comes back as it was submitted (never widened to "all"): ticked and typed names ticked.
        return await _list(request, admin, status=400, error=message(exc), values=form.values(),
                           current=_allowlist(form))
    return redirect(f"/ui/projects/{project_id}?done=created")


def _allowlist(form: Form) -> Any:
    """"all", or the ticked model names plus any typed in (comma-separated)."""
    if form.get("scope", "all") == "all":
        return "all"
    typed = [m.strip() for m in form.get("more_models").split(",") if m.strip()]
    return sorted(set(form.getlist("models")) | set(typed))


def _with_state(view: dict[str, Any]) -> dict[str, Any]:
    """A key's state now: active, expired, revoked, or rotated (and working until its grace ends)."""
    now = dt.datetime.now(dt.UTC)

    def at(name: str) -> dt.datetime | None:
        value = view.get(name)
        moment = dt.datetime.fromisoformat(value) if value else None
        return moment.replace(tzinfo=dt.UTC) if moment is not None and moment.tzinfo is None else moment
    revoked, expires = at("revoked_at"), at("expires_at")
    if revoked is not None and revoked <= now:
        view["state"] = "revoked"
    elif expires is not None and expires <= now:
        view["state"] = "expired"
    elif revoked is not None:  # a revocation set for later: a rotated key's grace period
        view["state"] = "rotated" if view.get("replaced_by") else "ending"
    else:
        view["state"] = "active"
    return view


async def _detail(request: Request, admin: Admin, project_id: int, *, status: int = 200,
                  errors: dict[str, str] | None = None, new_key: dict[str, Any] | None = None,
                  done: str = "", values: dict[str, str] | None = None, current: Any = None) -> Response:
    def work(s: Session) -> tuple[dict[str, Any], list[dict[str, Any]], list[str]]:
        project = tenancy.get_project_by_id(s, project_id)
        keys = [_with_state(tenancy.key_view(k, project.name)) for k in tenancy.list_keys(s, project=project.name)]
        return tenancy.project_view(project), keys, _model_names(s)
    project, keys, names = await components(request).in_session(work)
    current = project["models"] if current is None else current
    allowed = current if isinstance(current, list) else []
    return render(request, "project.html", admin, status=status, project=project, keys=list(reversed(keys)),
                  model_names=sorted(set(names) | set(allowed)), errors=errors or {}, new_key=new_key,
                  notice=NOTICES.get(done), values=values or {}, current=current)


@router.get("/projects/{project_id}")
async def detail_page(request: Request, project_id: int, done: str = "") -> Response:
    admin = await permitted(request, Need.PROJECT_READ, project_id=project_id)
    carried = request.cookies.get(SHELF_COOKIE)
    new_key = await ui_state(request).new_keys.take(admin.session, project_id, carried)  # shown once, then gone
    if new_key is None and done in ("key", "rotated"):
        done = "shown"
    response = await _detail(request, admin, project_id, done=done, new_key=new_key)
    if carried is not None:
        response.delete_cookie(SHELF_COOKIE, path=_page(project_id), httponly=True, samesite="strict")
    return response


async def _shown_next(request: Request, admin: Admin, project_id: int, new_key: dict[str, Any],
                      done: str) -> Response:
    """Keep a new key for the project page's one display (what the page shows of it, no more:
    the browser may carry it in a cookie, which must stay small), and redirect there."""
    shown = {field: new_key[field] for field in _SHOWN if new_key.get(field) is not None}
    carried = await ui_state(request).new_keys.put(admin.session, project_id, shown)
    response = redirect(f"{_page(project_id)}?done={done}")
    if carried is not None:  # no Redis: the browser carries it, sealed, to whichever replica serves the page
        response.set_cookie(SHELF_COOKIE, carried, max_age=SHELF_SECONDS, path=_page(project_id), httponly=True,
                            samesite="strict", secure=request.url.scheme == "https")
    return response


_SHOWN = ("key", "name", "replaces", "old_until")  # what project.html shows of a new key


def _page(project_id: int) -> str:
    return f"/ui/projects/{project_id}"


async def _update(request: Request, project_id: int, form_id: str, fields: Any, need: Need) -> Response:
    """Apply a project change (``fields(form)`` gives update_project's arguments), if ``need`` is granted."""
    admin = await permitted(request, need, project_id=project_id)
    form = await posted(request, admin)
    c = components(request)
    try:
        arguments = fields(form)
        await c.in_session(lambda s: tenancy.update_project(s, _project_name(s, project_id), admin.actor,
                                                            **arguments))
    except FORM_ERRORS as exc:  # the form comes back as it was submitted
        return await _detail(request, admin, project_id, status=400, errors={form_id: message(exc)},
                             values={"form": form_id, **form.values()},
                             current=_allowlist(form) if form_id == "models" else None)
    await c.changed_keys()
    done = form_id if form_id != "archive" else ("archived" if arguments["archived"] else "unarchived")
    return redirect(f"/ui/projects/{project_id}?done={done}")


@router.post("/projects/{project_id}/models")
async def set_models(request: Request, project_id: int) -> Response:
    def fields(form: Form) -> dict[str, Any]:
        body = validated(ProjectUpdate, {"models": _allowlist(form)})
        return {"models": body.models, "set_models": True}
    return await _update(request, project_id, "models", fields, Need.OWNER)


@router.post("/projects/{project_id}/limits")
async def set_limits(request: Request, project_id: int) -> Response:
    def fields(form: Form) -> dict[str, Any]:
        body = validated(ProjectUpdate, {
            "requests_per_minute": whole(form, "requests_per_minute", "Requests per minute"),
            "tokens_per_minute": whole(form, "tokens_per_minute", "Tokens per minute")})
        return {"limits": {"requests_per_minute": body.requests_per_minute,
                           "tokens_per_minute": body.tokens_per_minute}}
    return await _update(request, project_id, "limits", fields, Need.PROJECT_MANAGE)


@router.post("/projects/{project_id}/archive")
async def set_archived(request: Request, project_id: int) -> Response:
    def fields(form: Form) -> dict[str, Any]:
        if form.get("archived") not in ("true", "false"):
            raise InvalidRequest("Archived must be true or false")
        return {"archived": form.get("archived") == "true"}
    return await _update(request, project_id, "archive", fields, Need.OWNER)


@router.post("/projects/{project_id}/keys")
async def create_key(request: Request, project_id: int) -> Response:
    """A new project key: kept for one display and shown by the project page after the redirect
    (Post/Redirect/Get), so a reload neither shows it again nor makes another."""
    admin = await permitted(request, Need.PROJECT_MANAGE, project_id=project_id)
    form = await posted(request, admin)
    c = components(request)
    try:
        body = validated(KeyCreate, {"name": form.get("name"), "expires_at": form.get("expires_at") or None})

        def work(s: Session) -> dict[str, Any]:
            project = tenancy.get_project_by_id(s, project_id)
            key, value = tenancy.create_key(s, c.hasher, admin.actor, kind="project", project=project.name,
                                            name=body.name, expires_at=body.expires_at)
            return {**tenancy.key_view(key, project.name), "key": value}
        new_key = await c.in_session(work)
    except FORM_ERRORS as exc:
        return await _detail(request, admin, project_id, status=400, errors={"key": message(exc)},
                             values={"form": "key", **form.values()})
    return await _shown_next(request, admin, project_id, new_key, "key")


@router.post("/keys/{key_id}/rotate")
async def rotate_key(request: Request, key_id: int) -> Response:
    """As POST /admin/keys/{id}/rotate: a successor (shown once, as a new key is) and the old key
    working on for the grace period."""
    admin = await permitted(request, Need.KEY_MANAGE, key_id=key_id)
    form = await posted(request, admin)
    c = components(request)
    project_id = whole(form, "project", "project") or 0
    try:
        grace = whole(form, "grace_minutes", "Grace period")
        if grace is not None and not 0 <= grace <= 30 * 24 * 60:
            raise InvalidRequest("Grace period: from 0 to 43200 minutes (30 days)")
        body = validated(KeyRotate, {} if grace is None else {"grace_seconds": grace * 60})

        def work(s: Session) -> dict[str, Any]:
            key = tenancy.get_key(s, key_id)
            if key.project_id != project_id:
                raise InvalidRequest("That key does not belong to this project; reload the page")
            new, value = tenancy.rotate_key(s, c.hasher, key_id, admin.actor, grace_seconds=body.grace_seconds)
            return {**tenancy.key_view(new, tenancy.key_project_name(s, new)), "key": value,
                    "replaces": f"{key.prefix}…{key.last_four}", "old_until": tenancy.key_view(key)["revoked_at"]}
        new_key = await c.in_session(work)
    except FORM_ERRORS as exc:
        return await _detail(request, admin, project_id, status=400, errors={f"key-{key_id}": message(exc)})
    await c.changed_keys()
    return await _shown_next(request, admin, project_id, new_key, "rotated")


@router.post("/keys/{key_id}/revoke")
async def revoke_key(request: Request, key_id: int) -> Response:
    admin = await permitted(request, Need.KEY_MANAGE, key_id=key_id)
    form = await posted(request, admin)
    c = components(request)
    project_id = whole(form, "project", "project") or 0
    try:
        def work(s: Session) -> None:
            key = tenancy.get_key(s, key_id)
            if key.project_id != project_id:
                raise InvalidRequest("That key does not belong to this project; reload the page")
            tenancy.revoke_key(s, key_id, admin.actor)
        await c.in_session(work)
    except FORM_ERRORS as exc:
        return await _detail(request, admin, project_id, status=400, errors={f"key-{key_id}": message(exc)})
    await c.changed_keys()
    return redirect(f"/ui/projects/{project_id}?done=revoked")
