"""The OpenAPI description of ``POST /v1/decisions`` (a lean route: FastAPI cannot infer it).
The rules themselves are ``request.validate``; this is for documentation and fuzzing."""

from __future__ import annotations

from typing import Any

_TEXT_PART = {"type": "object", "required": ["type", "text"],
              "properties": {"type": {"const": "input_text"}, "text": {"type": "string"}}}
_TEXT = {"oneOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": _TEXT_PART}]}
# Any other JSON value (but null) is asked as its compact JSON text.
_STRUCTURED = {"anyOf": [_TEXT, {"not": {"type": "null"}}]}
_DESCRIPTION = {"description": "any JSON value; a non-string is asked as its compact JSON text"}
_NAMED = {"name": {"type": "string"}, "instructions": _STRUCTURED}

QUESTION: dict[str, Any] = {"oneOf": [
    {"type": "object", "required": ["type", "instructions"], "additionalProperties": False,
     "properties": {"type": {"const": "predicate"}, **_NAMED}},
    {"type": "object", "required": ["type", "instructions", "choices"], "additionalProperties": False,
     "properties": {"type": {"const": "choice"}, **_NAMED, "choices": {
         "type": "array", "minItems": 2, "maxItems": 255, "items": {
             "type": "object", "required": ["value"], "additionalProperties": False,
             "properties": {"value": {"type": ["string", "boolean"]}, "description": _DESCRIPTION}}}}},
    {"type": "object", "required": ["type", "instructions", "levels"], "additionalProperties": False,
     "properties": {"type": {"const": "score"}, **_NAMED, "levels": {
         "type": "array", "minItems": 2, "maxItems": 10, "items": {
             "type": "object", "required": ["label"], "additionalProperties": False,
             "properties": {"label": {"type": "string"}, "description": _DESCRIPTION}}}}},
]}

REQUEST: dict[str, Any] = {
    "type": "object",
    "required": ["model", "input", "questions"],
    "additionalProperties": False,
    "properties": {
        "model": {"type": "string", "minLength": 1},
        "input": {"oneOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["role", "content"], "additionalProperties": False,
            "properties": {"type": {"const": "message"}, "role": {"const": "user"}, "content": _TEXT}}}]},
        "questions": {"type": "array", "minItems": 1, "maxItems": 64, "items": QUESTION},
        "safety_identifier": {"type": ["string", "null"], "maxLength": 64},
        "prompt_cache_key": {"type": ["string", "null"]},
        "prompt_cache_options": {"type": ["object", "null"]},
    },
}

ANSWER: dict[str, Any] = {
    "type": "object", "required": ["model", "answers", "usage"],
    "properties": {"model": {"type": "string"}, "answers": {"type": "array", "items": {"type": "object"}},
                   "usage": {"type": "object"}},
}

ERROR: dict[str, Any] = {
    "type": "object", "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["message", "type", "param", "code"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"},
        "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}},
}


def route_openapi() -> dict[str, Any]:
    """The ``openapi_extra`` of the route: its request, its answer and its error shape."""
    def body(schema: dict[str, Any]) -> dict[str, Any]:
        return {"content": {"application/json": {"schema": schema}}}

    error = {"description": "an error in the OpenAI shape (a backend's own error too)", **body(ERROR)}
    return {"requestBody": {"required": True, **body(REQUEST)},
            "responses": {"200": {"description": "the answers, in question order", **body(ANSWER)},
                          "4XX": error, "5XX": error}}
