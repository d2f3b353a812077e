"""The append-only audit log of admin changes: actor, action, target, time, request id."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.models import AuditEntry
from app.db.timestamps import iso


def record(session: Session, *, actor: str, action: str, target: str,
           request_id: str | None = None, details: dict[str, Any] | None = None) -> None:
    """Add an entry in the caller's transaction, so the change and its record commit together."""
    session.add(AuditEntry(actor=actor, action=action, target=target, request_id=request_id,
                           details=details or {}))


def entries(session: Session, *, limit: int = 100, before_id: int | None = None) -> list[dict[str, Any]]:
    query = select(AuditEntry).order_by(AuditEntry.id.desc()).limit(limit)
    if before_id is not None:
        query = query.where(AuditEntry.id < before_id)
    return [
        {"id": e.id, "at": iso(e.at), "actor": e.actor, "action": e.action,
         "target": e.target, "request_id": e.request_id, "details": e.details}
        for e in session.scalars(query)
    ]
