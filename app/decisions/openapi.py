"""The OpenAPI description of the lean routes' bodies (they never reach FastAPI, so it cannot
infer them). Documentation and fuzzing use it; the validation itself is app/decisions/schema.py."""

from __future__ import annotations

from typing import Any

_CONTENT = {"oneOf": [{"type": "string"}, {"type": "object"}, {"type": "array"}, {"type": "null"}]}
_ANY = {"description": "any JSON value; the backend shows a non-string its own way"}
_MEDIA = {"type": "array", "items": {"type": "string"}, "description": "base64 strings or data: URLs"}

QUESTION: dict[str, Any] = {
    "type": "object",
    "required": ["type"],
    "properties": {
        "type": {"type": "string", "enum": ["choice", "noul", "score"]},
        "instructions": _ANY,
        "criteria": {"oneOf": [
            {"type": "object", "minProperties": 1, "maxProperties": 255,
             "additionalProperties": _ANY, "description": "choice: option -> description"},
            {"type": "object", "properties": {"true": _ANY, "false": _ANY},
             "additionalProperties": False, "description": "noul"},
            {"type": "array", "minItems": 2, "maxItems": 10, "items": {"not": {"type": "null"}},
             "description": "score: levels, lowest first"},
            {"type": "null"},
        ]},
    },
    "additionalProperties": True,
}

SYSTEMONE_REQUEST: dict[str, Any] = {
    "type": "object",
    "required": ["model", "state", "questions"],
    "properties": {
        "model": {"type": "string", "minLength": 1},
        "state": _CONTENT,
        "questions": {"type": "object", "minProperties": 1, "maxProperties": 64, "additionalProperties": QUESTION},
        "images": _MEDIA, "audio": _MEDIA, "videos": _MEDIA,
        "keep_alive": {"oneOf": [{"type": "number"}, {"type": "string"}]},
    },
    "additionalProperties": True,
}

CHAT_REQUEST: dict[str, Any] = {
    "type": "object",
    "required": ["model", "messages"],
    "properties": {
        "model": {"type": "string", "minLength": 1},
        "messages": {"type": "array", "items": {"type": "object"}},
        "stream": {"type": "boolean"},
    },
    "additionalProperties": True,
}

ANSWER: dict[str, Any] = {
    "type": "object", "required": ["model", "answers"],
    "properties": {"model": {"type": "string"}, "answers": {"type": "object"}, "usage": {"type": "object"}},
}
# Arbiter's own errors are {"error", "detail"}; a backend's pass through as they came.
ANY_OBJECT: dict[str, Any] = {"type": "object"}


def lean_route_openapi(request: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    def body(schema: dict[str, Any]) -> dict[str, Any]:
        return {"content": {"application/json": {"schema": schema}}}

    return {
        "requestBody": {"required": True, **body(request)},
        "responses": {
            "200": {"description": "the backend's answer, with model set to the public name", **body(answer)},
            "4XX": {"description": "an Arbiter error ({error, detail}) or the backend's own", **body(ANY_OBJECT)},
            "5XX": {"description": "an Arbiter error ({error, detail}) or the backend's own", **body(ANY_OBJECT)},
        },
    }
