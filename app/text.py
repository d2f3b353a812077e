"""What text an admin may write into names, lists and other fields: nothing that can be
stored but not shown again, and no name that a URL cannot reach."""

from __future__ import annotations

import re

# C0 and C1 control characters, DEL, and the UTF-16 surrogates.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be admin text, or None when it can. A lone surrogate (JSON's
    ``"\\ud800"``) parses and can be stored, but is no character: it cannot be encoded as UTF-8,
    so every answer, page and log line that would show it fails. Control characters break
    logs, headers and pages."""
    found = _UNSAFE.search(value)
    if found is None:
        return None
    if found.group() >= "\ud800":
        return "must not contain lone surrogates (\\ud800 to \\udfff)"
    return "must not contain control characters"


def path_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a thing in a URL path (``/admin/projects/{name}``), or None. A
    '/' splits the segment (even sent as %2F: the path is decoded before routing), and clients
    resolve the segments '.' and '..' away. Anything else can be sent percent-encoded."""
    if "/" in name:
        return "must not contain '/' (its URL, /admin/.../{name}, could not name it)"
    if name in (".", ".."):
        return "must not be '.' or '..' (URLs drop such path segments)"
    return None


def ascii_digits(value: str) -> bool:
    """Whether ``value`` is one or more ASCII digits, as an id, a page or a count typed in a URL
    must be. ``str.isdigit()`` also takes "²" and other digits that ``int()`` cannot read (a 500
    where a 400 or 404 belongs), and ``int()`` reads "٣" and " 3": neither is a number here. At
    most 18 digits: every id and count here fits, and ``int()`` refuses strings of over 4,300."""
    return len(value) <= 18 and value.isascii() and value.isdigit()
