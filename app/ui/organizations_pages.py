"""Organizations: each with its projects (links to their pages), add one, rename one. The same
domain calls as app/api/admin/tenancy.py (app/tenancy/organizations.py), so the same rules, the
same messages and the same audit entries (``organization.create``, ``organization.rename``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from sqlalchemy.orm import Session

from app.api.admin.schemas import OrganizationCreate, OrganizationRename
from app.tenancy import organizations
from app.tenancy import service as tenancy
from app.tenancy.roles import Need
from app.ui.roles import permitted
from app.ui.web import (
    FORM_ERRORS,
    Admin,
    UiRoute,
    by_id,
    components,
    message,
    posted,
    redirect,
    render,
    validated,
)

router = APIRouter(route_class=UiRoute)
NOTICES = {"added": "Organization added.", "renamed": "Organization renamed; its projects follow it."}


@router.get("/organizations")
async def list_page(request: Request, done: str = "") -> Response:
    return await _page(request, await permitted(request, Need.READ), notice=NOTICES.get(done))


async def _page(request: Request, admin: Admin, *, status: int = 200, errors: dict[str, str] | None = None,
                values: dict[str, str] | None = None, notice: str | None = None) -> Response:
    def work(s: Session) -> list[dict[str, Any]]:
        ids = {p.name: p.id for p in tenancy.list_projects(s)}
        return [{**org, "projects": [{"name": name, "id": ids.get(name)} for name in org["projects"]]}
                for org in organizations.list_organizations(s)]
    orgs = await components(request).in_session(work)
    return render(request, "organizations.html", admin, status=status, organizations=orgs, errors=errors or {},
                  values=values or {}, notice=notice)


@router.post("/organizations")
async def add(request: Request) -> Response:
    """As POST /admin/organizations."""
    admin = await permitted(request, Need.OWNER)
    form = await posted(request, admin)
    try:
        body = validated(OrganizationCreate, {"name": form.get("name")})
        await components(request).in_session(lambda s: tenancy.create_organization(s, body.name, admin.actor))
    except FORM_ERRORS as exc:
        return await _page(request, admin, status=400, errors={"add-organization": message(exc)},
                           values={"form": "add", **form.values()})
    return redirect("/ui/organizations?done=added")


@router.post("/organizations/{org_id}/rename")
async def rename(request: Request, org_id: int) -> Response:
    """As PATCH /admin/organizations/{name}: by id here, since a name may hold a '/'."""
    admin = await permitted(request, Need.OWNER)
    form = await posted(request, admin)
    c = components(request)

    def work(s: Session) -> None:
        current = by_id([_Row(o) for o in organizations.list_organizations(s)], org_id,
                        "That organization does not exist any more; reload the page").name
        organizations.rename_organization(s, current, body.name, admin.actor)
    try:
        body = validated(OrganizationRename, {"name": form.get("name")})
        await c.in_session(work)
    except FORM_ERRORS as exc:
        return await _page(request, admin, status=400, errors={f"org-{org_id}": message(exc)},
                           values={"form": str(org_id), **form.values()})
    return redirect(f"/ui/organizations?done=renamed#org-{org_id}")


class _Row:
    """An organization's view as a row with an id, for ``by_id``."""

    def __init__(self, view: dict[str, Any]) -> None:
        self.id: int = view["id"]
        self.name: str = view["name"]
