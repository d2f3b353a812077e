"""What the gateway reads of a backend's answer, and the one thing it changes in it (SPEC §1):
the answer comes back as it came but for ``model``, which becomes the public name the caller
sent. Decisions and chat both read answers this way, so it sits in the data plane below them.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import orjson

from app import jsonbody
from app.errors import ArbiterError

BIGINT_MAX = 2**63 - 1  # the ledger's token columns; past it a count is as good as unknown


def token_count(value: Any) -> int | None:
    """A token count an answer gives, or None when it is not one the ledger can hold."""
    return value if type(value) is int and 0 <= value <= BIGINT_MAX else None


def json_object(body: bytes) -> dict[str, Any] | None:
    """The answer as read for its usage and ``model`` (orjson: fast; past-64-bit integers may come
    back as floats, which is fine for reading, never for re-encoding: see ``with_model``)."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        try:
            value = jsonbody.loads(body)  # what orjson refuses and the strict parser takes
        except ArbiterError:
            return None
    return value if isinstance(value, dict) else None


def rewrite_model(body: bytes, backend_name: str, public_name: str) -> bytes:
    """A JSON object's ``model`` set to the public name; anything else unchanged."""
    answer = json_object(body)
    return body if answer is None else with_model(body, answer, backend_name, public_name)


def with_model(body: bytes, answer: dict[str, Any], backend_name: str, public_name: str) -> bytes:
    """The backend's bytes with ``model`` set to the public name, everything else as it came
    (``answer`` is ``body`` as ``json_object`` read it, for a caller that has read it already).

    Spliced into the bytes when the pair can be found there: where it leads the object (Ollama),
    or anywhere else when ``"model": "<backend name>"`` occurs once (a vLLM answer leads with
    ``id``). A JSON string cannot hold an unescaped quote, so such an occurrence is always a real
    member, and the top-level one is among them. Otherwise (the name written with escapes, or the
    same pair nested again, or only nested) the answer is re-encoded from a parse that keeps numbers
    as their text."""
    if backend_name == public_name and answer.get("model") == public_name:
        return body
    public, lead = _model_bytes(backend_name, public_name)
    if answer.get("model") == backend_name:
        stripped = body.lstrip()
        if stripped.startswith(lead):
            return b'{"model":' + public + stripped[len(lead):]
        found = list(_model_pair(backend_name).finditer(body))
        if len(found) == 1:
            value = found[0].span(1)
            spliced = body[:value[0]] + public + body[value[1]:]
            if (json_object(spliced) or {}).get("model") == public_name:  # it was the top-level one
                return spliced
    try:
        exact = jsonbody.loads(body)
    except ArbiterError:  # a key given twice (orjson kept the last), NaN: what was read will do
        exact = answer
    exact["model"] = public_name
    return jsonbody.dumps(exact)


@functools.lru_cache(maxsize=256)
def _model_bytes(backend_name: str, public_name: str) -> tuple[bytes, bytes]:
    """The public name as JSON, and ``{"model":<backend name>`` as an Ollama answer begins."""
    return orjson.dumps(public_name), b'{"model":' + orjson.dumps(backend_name)


@functools.lru_cache(maxsize=256)
def _model_pair(backend_name: str) -> re.Pattern[bytes]:
    """``"model": "<backend_name>"`` in an answer's bytes; group 1 is the value."""
    return re.compile(rb'"model"[ \t\r\n]*:[ \t\r\n]*(' + re.escape(orjson.dumps(backend_name)) + rb")")
