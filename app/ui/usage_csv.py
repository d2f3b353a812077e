"""CSV downloads of the usage pages: sent as they are read (a page of rows at a time), every text
cell guarded against formula injection. A spreadsheet runs a cell that starts with ``=``, ``+``,
``-`` or ``@`` (or a tab or carriage return before one) as a formula: such a cell gets a leading
``'``, which spreadsheets show as text. Model, project, key and alias names and request ids all
come from callers or admins."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import AsyncIterator, Iterable
from typing import Any

from fastapi.responses import StreamingResponse

FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
MEDIA_TYPE = "text/csv; charset=utf-8"
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def cell(value: Any) -> Any:
    """A value as a CSV cell: None blank, text that a spreadsheet would run made plain text."""
    if value is None:
        return ""
    if isinstance(value, str) and value.startswith(FORMULA_START):
        return "'" + value
    return value


def lines(rows: Iterable[Iterable[Any]]) -> str:
    """``rows`` as CSV text (RFC 4180: quoted where needed, CRLF line ends)."""
    out = io.StringIO()
    writer = csv.writer(out)
    for row in rows:
        writer.writerow([cell(value) for value in row])
    return out.getvalue()


def filename(*parts: str) -> str:
    """A download's file name from its parts (a project's name may hold any character): letters,
    digits, dots, dashes and underscores only, so the header needs no quoting rules."""
    cleaned = [_UNSAFE_NAME.sub("_", part).strip("._") for part in parts if part]
    return "-".join(part for part in cleaned if part)[:150] + ".csv"


def download(name: str, chunks: AsyncIterator[str]) -> StreamingResponse:
    """A ``text/csv`` attachment named ``name``, streamed from ``chunks``."""
    async def encoded() -> AsyncIterator[bytes]:
        async for chunk in chunks:
            yield chunk.encode("utf-8")
    return StreamingResponse(encoded(), media_type=MEDIA_TYPE,
                             headers={"Content-Disposition": f'attachment; filename="{name}"'})
