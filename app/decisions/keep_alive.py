"""``keep_alive``: a number of seconds, or a duration as Go's time.ParseDuration reads it."""

from __future__ import annotations

import re
from typing import Any

from app.jsonbody import is_number

_UNITS = {"ns": 1, "us": 10**3, "µs": 10**3, "μs": 10**3, "ms": 10**6, "s": 10**9,
          "m": 60 * 10**9, "h": 3600 * 10**9}
_PART = re.compile(r"([0-9]*)(?:\.([0-9]*))?(ns|us|µs|μs|ms|s|m|h)")
_MAX_NS = 2**63 - 1


def duration_ns(text: str) -> int | None:
    """Nanoseconds for a Go duration string, or None where Go would refuse it."""
    s = text
    negative = False
    if s[:1] in ("-", "+"):
        negative = s[0] == "-"
        s = s[1:]
    if s == "0":
        return 0
    if not s:
        return None
    total = 0
    position = 0
    while position < len(s):
        match = _PART.match(s, position)
        if match is None or match.end() == position:
            return None
        whole, fraction, unit = match.groups()
        if not whole and not fraction:
            return None  # ".s" or "s": Go wants a digit on one side of the point
        scale = _UNITS[unit]
        value = int(whole or "0") * scale
        if fraction:
            value += int(fraction) * scale // 10 ** len(fraction)
        total += value
        if total > _MAX_NS + (1 if negative else 0):
            return None  # overflow, as Go reports it
        position = match.end()
    return -total if negative else total


def valid(value: Any) -> bool:
    if value is None or is_number(value):  # null: the backend's default, as if absent
        return True
    return isinstance(value, str) and duration_ns(value) is not None
