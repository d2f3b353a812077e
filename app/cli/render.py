"""How the object commands print: ``--json`` gives the admin API's JSON as it is; otherwise a
plain table (a header, columns aligned by two spaces, ``-`` for nothing) or, for one object, its
fields one a line. Views never hold a secret (no key value, no digest, no credential), so
nothing here has to hide one."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Sequence
from typing import Any

Column = tuple[str, Callable[[dict[str, Any]], Any]]


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False))


def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[Column], empty: str) -> None:
    """``rows`` under ``columns`` (a header and how to get each cell), or ``empty`` for none."""
    if not rows:
        print(empty)
        return
    cells = [[header for header, _ in columns]] + [[cell(get(row)) for _, get in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    for line in cells:
        print("  ".join(value.ljust(width) for value, width in zip(line, widths, strict=True)).rstrip())


def print_record(view: dict[str, Any], extra: dict[str, Any] | None = None) -> None:
    """One object's fields, in the API's order, then ``extra`` (what the CLI works out from them)."""
    fields = {**view, **(extra or {})}
    width = max((len(name) for name in fields), default=0)
    for name, value in fields.items():
        text = when(value) if name.endswith("_at") and isinstance(value, str) else cell(value)
        print(f"{name.ljust(width)}  {text}".rstrip())


def cell(value: Any) -> str:
    """A value as one line of text."""
    if value is None or value == [] or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list):
        return ", ".join(cell(v) if not isinstance(v, dict) else cell(v.get("name", v)) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    text = str(value)
    return " ".join(text.split()) if any(c in text for c in "\n\r\t") else text


def when(value: str | None) -> str:
    """An ISO time from a view, to the second, in UTC."""
    moment = _moment(value)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ") if moment is not None else "-"


def key_state(view: dict[str, Any], now: dt.datetime | None = None) -> str:
    """A key's state now, as the web UI names it: active, expired, revoked, or rotated (working
    until its grace period ends; ``ending``: a revocation set for later without a successor)."""
    now = now or dt.datetime.now(dt.UTC)
    revoked, expires = _moment(view.get("revoked_at")), _moment(view.get("expires_at"))
    if revoked is not None and revoked <= now:
        return "revoked"
    if expires is not None and expires <= now:
        return "expired"
    if revoked is not None:
        return f"rotated (works until {when(view['revoked_at'])})" if view.get("replaced_by") else \
            f"ending {when(view['revoked_at'])}"
    return "active"


def masked(view: dict[str, Any]) -> str:
    """A key as the API lets it be recognised: its prefix and last four characters."""
    return f"{view.get('prefix', '')}...{view.get('last_four', '')}"


def _moment(value: str | None) -> dt.datetime | None:
    if not value:
        return None
    moment = dt.datetime.fromisoformat(value)
    return (moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)).astimezone(dt.UTC)
