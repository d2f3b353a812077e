"""The usage ledger a request at a time (the web UI's drill-down): the latest requests that match
some filters, newest first and paged by id; one request by the id its caller got in
``X-Request-Id``; and the filters' checks, each refusal saying what is accepted."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from app.db.models import ApiKey, Project, UsageRecord
from app.db.timestamps import iso
from app.errors import InvalidRequest
from app.telemetry.usage_report import Period, scoped
from app.text import ascii_digits, text_problem

PAGE = 50
SAME_ID = 20  # the records shown for one request id: a caller may send the same X-Request-Id again
# What app/api/middleware.py takes as a caller's X-Request-Id (and its own ids are hex): nothing
# else can be in the ledger.
REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
STATUS_CLASSES = {"2xx": (200, 299), "3xx": (300, 399), "4xx": (400, 499), "5xx": (500, 599),
                  "errors": (400, 599)}
MAX_MODEL = 200  # as UsageRecord.model


@dataclass(frozen=True)
class Filters:
    """What the drill-down keeps: a project (by name), a key (by id), a model (or the alias the
    caller named) and a status (a class, "errors" or one code). None keeps everything."""

    project: str | None = None
    key_id: int | None = None
    model: str | None = None
    status: str | None = None

    def status_range(self) -> tuple[int, int] | None:
        if self.status is None:
            return None
        return STATUS_CLASSES.get(self.status) or (int(self.status), int(self.status))


def checked_status(value: str) -> str | None:
    """A status filter as typed or chosen: blank (any), 2xx to 5xx, errors, or a code 100-599."""
    value = value.strip().lower()
    if not value:
        return None
    if value in STATUS_CLASSES or (ascii_digits(value) and len(value) == 3 and 100 <= int(value) <= 599):
        return value
    raise InvalidRequest(f"Status must be 2xx, 3xx, 4xx, 5xx, errors or a code from 100 to 599, not {value[:40]!r}")


def checked_key(value: str) -> int | None:
    """A key filter: blank (any) or a key's id, as the per-key view links it."""
    value = value.strip()
    if not value:
        return None
    if not ascii_digits(value) or not 0 < int(value) < 2**31:
        raise InvalidRequest(f"Key must be a key's id (a whole number, from the list), not {value[:40]!r}")
    return int(value)


def checked_model(value: str) -> str | None:
    value = value.strip()
    if not value:
        return None
    if len(value) > MAX_MODEL:
        raise InvalidRequest(f"Model: at most {MAX_MODEL} characters (a model's or an alias's public name)")
    problem = text_problem(value)
    if problem is not None:
        raise InvalidRequest(f"Model {problem}")
    return value


def checked_request_id(value: str) -> str | None:
    """A request id to look for: what the caller got in X-Request-Id (spaces around it ignored)."""
    value = value.strip()
    if not value:
        return None
    if not REQUEST_ID.match(value):
        raise InvalidRequest("A request id is 1 to 64 letters, digits, dots, colons, dashes or underscores, "
                             f"as in the X-Request-Id header of the answer; not {value[:70]!r}")
    return value


def page(session: Session, filters: Filters, period: Period, *, projects: Collection[str] | None = None,
         before_id: int | None = None, limit: int = PAGE) -> list[dict[str, Any]]:
    """The latest ``limit`` requests of ``period`` that match ``filters`` (older than ``before_id``
    when given), newest first; ``projects`` keeps a project-admin's."""
    query = _matching(session, filters, period, projects)
    if before_id is not None:
        query = query.where(UsageRecord.id < before_id)
    return [_view(row) for row in session.execute(query.order_by(UsageRecord.id.desc()).limit(limit))]


def export(session: Session, filters: Filters, period: Period, *, projects: Collection[str] | None = None,
           before: tuple[dt.datetime, int] | None = None, limit: int = PAGE) -> list[dict[str, Any]]:
    """As ``page``, newest first by time (then id), for a download: the next page starts after the
    last row's (time, id), ``before``, found along the time index (``ix_usage_ledger_project_at`` for a
    project): each page reads its own rows only, so a whole download is linear in its rows."""
    query = _matching(session, filters, period, projects)
    if before is not None:
        at, last = before
        query = query.where(UsageRecord.at <= at, or_(UsageRecord.at < at, UsageRecord.id < last))
    newest = query.order_by(UsageRecord.at.desc(), UsageRecord.id.desc()).limit(limit)
    return [_view(row) for row in session.execute(newest)]


def position(row: dict[str, Any]) -> tuple[dt.datetime, int]:
    """Where ``export``'s next page starts: after ``row``."""
    return row["time"], row["id"]


def _matching(session: Session, filters: Filters, period: Period, projects: Collection[str] | None) -> Any:
    query = _rows(scoped(_columns(), period, filters.project, projects, session))
    if filters.key_id is not None:
        query = query.where(UsageRecord.key_id == filters.key_id)
    if filters.model is not None:
        query = query.where(or_(UsageRecord.model == filters.model, UsageRecord.alias == filters.model))
    status = filters.status_range()
    if status is not None:
        query = query.where(UsageRecord.status.between(*status))
    return query


def with_request_id(session: Session, request_id: str, *,
                    projects: Collection[str] | None = None) -> list[dict[str, Any]]:
    """Every record (up to ``SAME_ID``, newest first) of the request whose caller got ``request_id``."""
    query = _rows(scoped(_columns(), None, None, projects, session)).where(UsageRecord.request_id == request_id)
    return [_view(row) for row in session.execute(query.order_by(UsageRecord.id.desc()).limit(SAME_ID))]


def _columns() -> Any:
    return select(UsageRecord, Project.name.label("project"), ApiKey.prefix, ApiKey.last_four,
                  ApiKey.name.label("key_name"))


def _rows(query: Any) -> Any:
    return query.outerjoin(ApiKey, ApiKey.id == UsageRecord.key_id)


def _view(row: Any) -> dict[str, Any]:
    record: UsageRecord = row[0]
    return {"id": record.id, "at": iso(record.at), "time": record.at, "request_id": record.request_id,
            "project": row.project,
            "key_id": record.key_id, "key": f"{row.prefix}…{row.last_four}" if row.prefix else "",
            "key_name": row.key_name or "", "operation": record.operation, "model": record.model,
            "alias": record.alias, "provider": record.provider, "status": record.status,
            "latency_ms": record.latency_ms, "input_tokens": record.input_tokens,
            "output_tokens": record.output_tokens}
