"""Request checks of the Ollama emulator's `/v1/systemone`, worded like Ollama's errors."""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

import orjson

from .answers import QUESTION_TYPES

MAX_QUESTIONS = 64
CHOICE_OPTIONS = (2, 255)
SCORE_LEVELS = (2, 10)
MEDIA_CAPABILITY = {"images": "vision", "audio": "audio", "videos": "video"}
_DURATION_RE = re.compile(r"[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:ns|us|µs|μs|ms|s|m|h))+")
_JSON_TYPE_NAMES = {list: "array", str: "string", bool: "bool", int: "number", float: "number"}


def go_type(value: Any) -> str:
    return _JSON_TYPE_NAMES.get(type(value), "object" if isinstance(value, dict) else "value")


def bad_keep_alive(value: Any) -> str | None:
    if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
        return None
    if isinstance(value, str):
        if value in ("0", "+0", "-0") or _DURATION_RE.fullmatch(value):
            return None
        return f'time: invalid duration "{value}"'
    return f"json: cannot unmarshal {go_type(value)} into Go struct field .keep_alive"


def bad_media(value: Any, key: str) -> str | None:
    if not isinstance(value, list):
        return f"json: cannot unmarshal {go_type(value)} into Go struct field .{key}"
    for item in value:
        if not isinstance(item, str):
            return f"json: cannot unmarshal {go_type(item)} into Go struct field .{key}"
        try:
            base64.b64decode(item.replace("\r", "").replace("\n", ""), validate=True)
        except (binascii.Error, ValueError):
            bad = next((i for i, c in enumerate(item) if not (c.isalnum() or c in "+/=")), 0)
            return f"illegal base64 data at input byte {bad}"
    return None


def bad_question(qid: str, q: Any) -> str | None:
    where = f'question "{qid}"'
    if not qid:
        return "question ids must be non-empty"
    if not isinstance(q, dict):
        return f"{where}: must be an object"
    qtype = q.get("type")
    if qtype not in QUESTION_TYPES:
        return (
            f'{where}: unknown type "{qtype}"'
            if isinstance(qtype, str)
            else (f"{where}: type is required")
        )
    criteria = q.get("criteria")
    if qtype == "choice":
        if not isinstance(criteria, dict):
            return f"{where}: choice criteria must be an object of options"
        lo, hi = CHOICE_OPTIONS
        if not lo <= len(criteria) <= hi:
            return f"{where}: choice needs {lo} to {hi} options, got {len(criteria)}"
        if any(k == "" for k in criteria):
            return f"{where}: option names must be non-empty"
    elif qtype == "noul":
        if criteria is not None:
            if not isinstance(criteria, dict):
                return f"{where}: noul criteria must be null or an object"
            extra = [k for k in criteria if k not in ("true", "false")]
            if extra:
                return f'{where}: noul criteria keys must be "true" or "false", got "{extra[0]}"'
    else:
        if not isinstance(criteria, list):
            return f"{where}: score criteria must be an array of levels"
        lo, hi = SCORE_LEVELS
        if not lo <= len(criteria) <= hi:
            return f"{where}: score needs {lo} to {hi} levels, got {len(criteria)}"
        if any(level is None for level in criteria):
            return f"{where}: score levels must not be null"
    # Instructions and descriptions are any JSON value, shown as compact JSON (answers.compact_text).
    return None


def text_size(payload: dict[str, Any]) -> int:
    text = {k: v for k, v in payload.items() if k not in MEDIA_CAPABILITY}
    return len(orjson.dumps(text))
