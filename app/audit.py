"""The append-only audit log of admin changes: actor, action, target, time, request id.

``request_id`` is always Arbiter's own id for the request; the ``X-Request-Id`` a caller sent
is kept beside it as ``client_request_id`` (app/request_ids.py), since a caller can name its
request anything, another request's id included. Sign-ins to the web UI are recorded too.
On PostgreSQL a trigger refuses DELETE on the table, and any UPDATE but one that makes an
entry's ``count`` grow (migrations 0010 and 0014).

Nothing a caller sends can grow the log without bound: every text it holds (target, actor, the
strings of the details, at any depth) is cut to ``CUT`` characters (the target to its column's
400) and ends with ``CUT_MARK`` when it was; and a refusal (``fold``) is written once per actor,
action, target and minute, the later ones adding one to that entry's ``count``. Folding in the
database (an upsert on a unique key) keeps it right across replicas and crashes: every refusal is
counted the moment it is answered, none waits in memory.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Mapping
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from app.db.models import AuditEntry, utcnow
from app.db.timestamps import iso
from app.request_ids import ids_of

CUT = 512          # the longest text an entry keeps of anything a caller sent
CUT_MARK = "…(cut)"  # the end of a text that was cut
_ACTOR, _TARGET = 200, 400  # their columns' widths


def cut(text: str, limit: int = CUT) -> str:
    """``text``, or its first characters and CUT_MARK when it is longer than ``limit``."""
    return text if len(text) <= limit else text[:limit - len(CUT_MARK)] + CUT_MARK


def _cut_all(value: Any) -> Any:
    """``value`` with every string in it (dict keys too, at any depth) cut."""
    if isinstance(value, str):
        return cut(value)
    if isinstance(value, dict):
        return {cut(str(k)): _cut_all(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_cut_all(v) for v in value]
    return value


def _entry(actor: str, action: str, target: str, request_id: str | None,
           details: dict[str, Any] | None) -> dict[str, Any]:
    own, caller = ids_of(request_id)
    return {"actor": cut(actor, _ACTOR), "action": action, "target": cut(target, _TARGET), "request_id": own,
            "client_request_id": caller, "details": _cut_all(details or {})}


def record(session: Session, *, actor: str, action: str, target: str,
           request_id: str | None = None, details: dict[str, Any] | None = None) -> None:
    """Add an entry in the caller's transaction, so the change and its record commit together."""
    session.add(AuditEntry(**_entry(actor, action, target, request_id, details)))


def fold_key(actor: str, action: str, at: dt.datetime) -> str:
    """What the refusals folded into one entry share: actor, action and the UTC minute. Not the
    target: a key cycling through every route it may not use still makes one entry a minute."""
    minute = at.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M")
    return hashlib.sha256(f"{actor}\n{action}\n{minute}".encode()).hexdigest()


def fold(session: Session, *, actor: str, action: str, target: str, request_id: str | None = None,
         details: dict[str, Any] | None = None, at: dt.datetime | None = None) -> None:
    """Record a repeatable event (a refusal): the first of an actor and action in a minute adds an
    entry (with its target, request id and details), each later one, whatever its target, adds one
    to that entry's ``count``. One statement, atomic on either database, so replicas sharing one
    never write two."""
    values = _entry(actor, action, target, request_id, details)
    now = at or utcnow()
    values.update(at=now, count=1, fold_key=fold_key(values["actor"], action, now))
    grow: dict[str, Any] = {"index_elements": [AuditEntry.fold_key], "set_": {"count": AuditEntry.count + 1}}
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        session.execute(postgresql.insert(AuditEntry).values(**values).on_conflict_do_update(**grow))
    elif dialect == "sqlite":
        session.execute(sqlite.insert(AuditEntry).values(**values).on_conflict_do_update(**grow))
    else:
        raise RuntimeError(f"the audit log folds refusals on PostgreSQL or SQLite, not on {dialect}")


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
         "details": e.details, "count": e.count}
        for e in session.scalars(query)
    ]
