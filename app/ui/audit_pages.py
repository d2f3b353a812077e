"""The audit log page: every change, newest first, a page at a time, filtered by actor, action
and target (query parameters that the paging links keep). An entry's details read as
``key: value``; a value that is not text (a list, an object, a number) is shown as JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request, Response

from app import audit
from app.tenancy.roles import Need
from app.text import ascii_digits
from app.ui.roles import permitted
from app.ui.web import UiRoute, components, render

router = APIRouter(route_class=UiRoute)
PAGE = 100
FILTERS = ("actor", "action", "target")


@router.get("/audit")
async def audit_page(request: Request, before_id: str = "", actor: str = "", action: str = "",
                     target: str = "") -> Response:
    admin = await permitted(request, Need.READ)
    before = int(before_id) if ascii_digits(before_id) and 1 <= int(before_id) <= 2**62 else None  # else page 1
    filters = {"actor": actor.strip(), "action": action.strip(), "target": target.strip()}
    problem = audit.filter_problem(filters)
    if problem is not None:
        return render(request, "audit.html", admin, status=400, entries=[], filters=filters, older_url=None,
                      newest_url=None, errors={"audit-filters": problem}, link=_linker(filters))
    chosen = {name: value or None for name, value in filters.items()}
    found = await components(request).in_session(
        lambda s: audit.entries(s, limit=PAGE, before_id=before, **chosen))
    rows = [{**entry, "items": detail_items(entry["details"])} for entry in found]
    older = found[-1]["id"] if len(found) == PAGE else None
    return render(request, "audit.html", admin, entries=rows, filters=filters, paged=before is not None,
                  older_url=page_url(filters, before_id=older) if older else None,
                  newest_url=page_url(filters) if before is not None else None, errors={},
                  link=_linker(filters))


def page_url(filters: Mapping[str, str], **more: Any) -> str:
    """/ui/audit with the filters in use (blank ones left out) and ``more``."""
    query = urlencode({k: v for k, v in {**filters, **more}.items() if v not in ("", None)})
    return "/ui/audit" + (f"?{query}" if query else "")


def _linker(filters: Mapping[str, str]) -> Any:
    """For the template: the page filtered by one more field (a cell's actor, action or target)."""
    return lambda name, value: page_url({**filters, name: value})


def detail_items(details: Any) -> list[dict[str, Any]]:
    """Details as (key, text, is_json) rows: text as it is; anything else as JSON."""
    if not isinstance(details, dict):
        return [] if details in (None, "") else [{"key": "details", **_value(details)}]
    return [{"key": str(key), **_value(value)} for key, value in details.items()]


def _value(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        return {"text": value, "json": False}
    return {"text": json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str), "json": True}
