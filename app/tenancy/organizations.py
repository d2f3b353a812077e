"""Organizations as the admin API, the CLI and the web UI read and rename them: each with its
projects. Creating one stays beside projects (app/tenancy/service.py), whose creation makes the
``default`` organization on demand."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app import audit
from app.db.models import Organization, Project
from app.db.timestamps import iso
from app.errors import Conflict, NotFound
from app.tenancy.service import Actor, _check_name, project_view


def list_organizations(session: Session) -> list[dict[str, Any]]:
    """Every organization by name, each with the names of its projects (two queries, whatever
    the number of organizations)."""
    names: defaultdict[int, list[str]] = defaultdict(list)
    for org_id, project in session.execute(select(Project.organization_id, Project.name).order_by(Project.name)):
        names[org_id].append(project)
    return [organization_view(org, names[org.id])
            for org in session.scalars(select(Organization).order_by(Organization.name))]


def show_organization(session: Session, name: str) -> dict[str, Any]:
    """One organization with its projects as the admin API shows a project."""
    org = get_organization(session, name)
    projects = session.scalars(select(Project).where(Project.organization_id == org.id).order_by(Project.name))
    return {**organization_view(org, []), "projects": [project_view(p) for p in projects]}


def rename_organization(session: Session, name: str, new_name: str, actor: Actor) -> dict[str, Any]:
    """Give organization ``name`` the name ``new_name`` (the rules of a new organization's name);
    a name another organization has is a Conflict. Its projects, keys and usage follow it: they
    refer to it by id. Renaming ``default`` is allowed: a project later created without an
    organization then goes to a new ``default``."""
    _check_name(new_name, "organization")
    org = get_organization(session, name)
    if new_name != org.name:
        if session.scalar(select(Organization.id).where(Organization.name == new_name)) is not None:
            raise Conflict(f"organization '{new_name}' already exists")
        org.name = new_name
        try:
            session.flush()
        except IntegrityError as exc:  # another request took the name since the check above
            raise Conflict(f"organization '{new_name}' already exists") from exc
        audit.record(session, actor=actor.name, action="organization.rename", target=f"organization:{new_name}",
                     request_id=actor.request_id, details={"from": name, "to": new_name})
    return show_organization(session, new_name)


def get_organization(session: Session, name: str) -> Organization:
    org = session.scalar(select(Organization).where(Organization.name == name))
    if org is None:
        raise NotFound(f"organization '{name[:200]}' does not exist")
    return org


def organization_view(org: Organization, projects: list[str]) -> dict[str, Any]:
    """An organization as the admin API lists it: its projects by name."""
    return {"id": org.id, "name": org.name, "created_at": iso(org.created_at), "projects": projects}
