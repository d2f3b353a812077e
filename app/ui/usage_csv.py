"""CSV downloads of the usage pages: sent as they are read (a page of rows at a time), every text
cell guarded against formula injection. A spreadsheet runs a cell that starts with ``=``, ``+``,
``-`` or ``@`` (or a tab or carriage return before one) as a formula: such a cell gets a leading
``'``, which spreadsheets show as text. A spreadsheet may also split a line at a ``;`` or a tab
(its locale's separator, not the comma), and then quotes do not hold (a quote mid-field is just a
character): a cell holding any separator (``,`` ``;`` tab, a quote or a line break) is quoted, and
where a formula would start after such a separator (``ops;=cmd``) a ``'`` goes in front of it
(``ops;'=cmd``), so no piece of the cell starts one however it is split. Model, project, key and
alias names and request ids all come from callers or admins."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterable
from typing import Any

from fastapi.responses import StreamingResponse

FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
SEPARATORS = (",", ";", "\t", '"', "\r", "\n")  # a cell holding one is quoted
MEDIA_TYPE = "text/csv; charset=utf-8"
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")
_FORMULA_AFTER_SEPARATOR = re.compile(r"([,;\t\r\n\"] *)(?=[=+\-@\t\r])")  # the separator (and spaces)


def cell(value: Any) -> Any:
    """A value as a CSV cell: None blank, text that a spreadsheet would run made plain text (at its
    start, and after each separator a spreadsheet could split it at)."""
    if value is None:
        return ""
    if not isinstance(value, str):
        return value
    value = _FORMULA_AFTER_SEPARATOR.sub(r"\1'", value)
    return "'" + value if value.startswith(FORMULA_START) else value


def field(value: Any) -> str:
    """A cell as it is written: guarded, and quoted (its quotes doubled, RFC 4180) when it holds a
    separator of any locale."""
    text = str(cell(value))
    if any(c in text for c in SEPARATORS):
        return '"' + text.replace('"', '""') + '"'
    return text


def lines(rows: Iterable[Iterable[Any]]) -> str:
    """``rows`` as CSV text (RFC 4180: CRLF line ends, quoted where a separator is)."""
    return "".join(",".join(field(value) for value in row) + "\r\n" for row in rows)


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
