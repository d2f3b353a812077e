"""What text an admin may write into names, lists and other fields: nothing that can be
stored but not shown again."""

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
