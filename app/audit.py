"""The append-only audit log of admin changes: actor, action, target, time, request id.

``request_id`` is always Arbiter's own id for the request; the ``X-Request-Id`` a caller sent
is kept beside it as ``client_request_id`` (app/request_ids.py), since a caller can name its
request anything, another request's id included. Sign-ins to the web UI are recorded too.
On PostgreSQL a trigger refuses UPDATE and DELETE on the table (migration 0010).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from app.db.models import AuditEntry
from app.db.timestamps import iso
from app.request_ids import ids_of


def record(session: Session, *, actor: str, action: str, target: str,
           request_id: str | None = None, details: dict[str, Any] | None = None) -> None:
    """Add an entry in the caller's transaction, so the change and its record commit together."""
    own, caller = ids_of(request_id)
    session.add(AuditEntry(actor=actor, action=action, target=target, request_id=own,
                           client_request_id=caller, details=details or {}))


MAX_FILTER = 200  # longer than any actor (200) or action (100); a target holds at most 400


def filter_problem(filters: Mapping[str, str]) -> str | None:
    """Why an actor, action or target filter cannot be used (the UI shows it beside its form, the
    admin API answers it as a 400); None when all can."""
    for name, value in filters.items():
        if len(value) > MAX_FILTER:
            return f"The {name} filter is longer than {MAX_FILTER} characters; shorten it."
        if any(ord(c) < 32 or ord(c) == 127 for c in value):
            return f"The {name} filter holds a control character; type plain text."
    return None


def entries(session: Session, *, limit: int = 100, before_id: int | None = None, actor: str | None = None,
            action: str | None = None, target: str | None = None) -> list[dict[str, Any]]:
    """The newest entries first, older than ``before_id`` when given. ``actor`` and ``target``
    keep the entries whose actor or target holds that text (any case); ``action`` those of that
    action or of its dotted family (``project`` keeps ``project.create`` and ``project.update``)."""
    query = select(AuditEntry).order_by(AuditEntry.id.desc()).limit(limit)
    if before_id is not None:
        query = query.where(AuditEntry.id < before_id)
    if actor:
        query = query.where(AuditEntry.actor.icontains(actor, autoescape=True))
    if action:
        query = query.where(or_(AuditEntry.action == action,
                                AuditEntry.action.startswith(f"{action}.", autoescape=True)))
    if target:
        query = query.where(AuditEntry.target.icontains(target, autoescape=True))
    return [
        {"id": e.id, "at": iso(e.at), "actor": e.actor, "action": e.action,
         "target": e.target, "request_id": e.request_id, "client_request_id": e.client_request_id,
         "details": e.details}
        for e in session.scalars(query)
    ]
