"""Parse a request body once, strictly; dump what is forwarded with exact numbers.

- duplicate keys and NaN/Infinity are refused (400);
- so is what parses but cannot be written back (a lone surrogate escape such as
  ``"\\ud800"``, nesting past orjson's 255 levels): every body ``loads`` gives,
  ``dumps`` can write, so forwarding it never fails half-way (after a replica
  was picked);
- floats, and integers too large for 64 bits, are kept as ``orjson.Fragment``
  holding their original text, so the forwarded body carries the caller's
  exact number, never a rounded re-encoding.

Two parsers, one result. msgspec (C, floats handed to ``Fragment`` as their text)
takes a body first; it keeps the last of duplicate keys, so its result is
accepted only when it holds as many object members as the body has: each
member brings exactly one ``:`` outside strings, strings are the same in the
body and in the re-encoded result, so a body with a key twice has more colons
than ``orjson.dumps`` of what msgspec kept. Anything msgspec refuses, or whose
counts differ, goes through the standard library's parser with hooks, which
gives the exact 400 (duplicate key, NaN, bad UTF-8, ...) or the value.
Measured on the benchmark's 1.6 KB body: 12 us -> 7 us. Only bodies up to
``FAST_MAX_BYTES`` take the fast path: msgspec turns an integer of up to 4,300
digits into an int (quadratic: ~0.16 ms each) before orjson refuses it, so a
large body full of them would hold the event loop far longer than the strict
parser, which keeps such numbers as text.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import orjson

from app.errors import ValidationFailed, problem

Fragment = orjson.Fragment


class _Refused(ValueError):
    pass


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Refused(f"duplicate key {key!r} in a JSON object")
            seen.add(key)
    return obj


def _constant(name: str) -> Any:
    raise _Refused(f"{name} is not valid JSON")


def _int(text: str) -> Any:
    if len(text) < 19:
        return int(text)
    if len(text) <= 20:  # maybe still within 64 bits, which orjson encodes natively
        value = int(text)
        if -(2**63) <= value < 2**64:
            return value
    return Fragment(text)  # kept as text: never int() on thousands of digits


_decoder = json.JSONDecoder(
    object_pairs_hook=_pairs, parse_float=Fragment, parse_int=_int, parse_constant=_constant
)


FAST_MAX_BYTES = 16 * 1024  # worst case there: three 4,300-digit integers, ~0.5 ms
_fast = msgspec.json.Decoder(float_hook=Fragment)
# What msgspec refuses (bad JSON, ints past 64 bits, lone surrogates, deep nesting) and what
# orjson cannot re-encode (nesting past its limit): the standard library's parser decides.
_FAST_REFUSED = (msgspec.DecodeError, TypeError, ValueError, RecursionError, orjson.JSONEncodeError)


def loads(body: bytes) -> Any:
    """Parse ``body`` or raise ValidationFailed (400) naming what is wrong."""
    if len(body) > FAST_MAX_BYTES:
        return _strict(body)
    try:
        value = _fast.decode(body)
        kept = orjson.dumps(value).count(b":")
    except _FAST_REFUSED:
        return _strict(body)
    members = body.count(b":")
    if b"\\u003" in body:  # a colon written as an escape counts as one
        members += body.count(b"\\u003a") + body.count(b"\\u003A")
    return value if kept == members else _strict(body)


def _strict(body: bytes) -> Any:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _invalid(f"the body is not UTF-8 ({exc.reason} at byte {exc.start})") from exc
    try:
        value = _decoder.decode(text)
    except _Refused as exc:
        raise _invalid(str(exc)) from exc
    except json.JSONDecodeError as exc:
        raise _invalid(f"the body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from exc
    except RecursionError as exc:
        raise _invalid("the body nests too deeply") from exc
    dumps(value)  # the fast path's values were written already; these may not be writable
    return value


def dumps(value: Any) -> bytes:
    """Compact JSON, non-ASCII kept (the form the text limit is measured in)."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError as exc:
        # Lone surrogates ("\ud800") parse but cannot be encoded as UTF-8.
        raise _invalid(f"the body cannot be re-encoded (a lone surrogate escape such as \\ud800, or "
                       f"nesting past 255 levels): {exc}") from exc


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float, Fragment)) and not isinstance(value, bool)


def number_value(value: Any) -> float:
    if isinstance(value, Fragment):
        return float(orjson.dumps(value))  # a Fragment dumps as its own text
    return float(value)


def _invalid(message: str) -> ValidationFailed:
    return ValidationFailed([problem((), message, "json_invalid")])
