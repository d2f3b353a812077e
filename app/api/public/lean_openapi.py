"""What the OpenAPI document says of the lean routes (``/v1/systemone``, ``/v1/decisions``, the
chat routes). Their POST never reaches FastAPI (app/main.py serves it before), so the
placeholder route FastAPI holds for each carries it all, as documentation only:

- the request body is an OpenAPI-only schema (``openapi_extra``): the placeholder declares no
  body parameter, so FastAPI would not parse a body even if one reached it;
- the answer's model sits in ``responses``, never in ``response_model``: the backend's JSON goes
  back byte for byte (SPEC §1), and nothing validates or re-serialises it;
- every status of SPEC §1's table is declared with when it happens. A backend's own error comes
  back as it came, any status, so each one's body is Arbiter's ``Error`` or the backend's own
  (on ``/v1/decisions``: OpenAI's shape either way), and ``4XX``/``5XX`` stand for the rest.

A tenant calls them with a project key; a mesh peer that forwards a request signs it with its
mesh credential instead (app/api/public/intake.py reads both).
"""

from __future__ import annotations

from typing import Any

from app.decisions.openai_api.openapi import REQUEST as OPENAI_DECISIONS_REQUEST
from app.decisions.openai_api.openapi import DecisionAnswer, OpenAIError
from app.decisions.openapi import CHAT_REQUEST, SYSTEMONE_REQUEST, SystemOneAnswer

SECURITY: list[dict[str, list[str]]] = [{"projectKey": []}, {"meshCredential": []}]
ERROR_REF = {"$ref": "#/components/schemas/Error"}  # app/api/openapi.py puts Error in the document
PASSED_ON = {"description": "a backend's own error: its status, bytes and content type as it came"}
_RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before trying again", "schema": {"type": "integer"}}}
_HEADERS: dict[int, dict[str, Any]] = {
    401: {"WWW-Authenticate": {"description": "Bearer", "schema": {"type": "string"}}},
    415: {"Accept-Encoding": {"description": "gzip, zstd, identity", "schema": {"type": "string"}}},
    429: _RETRY_AFTER, 503: _RETRY_AFTER,
}
# SPEC §1's table. Only Arbiter answers these two: no backend is asked before them.
_ARBITERS_OWN = frozenset({401, 415})
_STATUSES = {
    400: "a body that is not JSON, breaks the field rules (detail lists every problem) or asks what the "
         "model cannot take (media without the capability, remote media URLs); more than one Authorization header",
    401: "no key, or an unknown, revoked, expired or tampered one, or an admin key",
    403: "the model is not in the project's allowlist (whether or not it exists), or the project is archived",
    404: "the model is not installed on this node nor on any mesh peer",
    405: "the only backends or mesh nodes that have the model cannot answer decisions (a version gate)",
    413: "over the body cap (ARBITER_MAX_BODY_BYTES) or the text limit of the model's service",
    415: "an unsupported Content-Encoding",
    429: "the project's or the key's rate limit is spent",
    500: "a backend or mesh peer rejected Arbiter's own credential (upstream_auth_error)",
    502: "the backend could not be reached, broke the connection, or answered a 200 that is not a JSON "
         "object or is over the response cap",
    503: "every backend with the model is down or backed off, Arbiter is at ARBITER_MAX_CONCURRENCY, or the "
         "key cannot be checked (the database is away)",
    504: "the backend did not answer within the model's timeout",
}
# What the middleware answers before a route is chosen, in Arbiter's shape on every route.
_BEFORE_THE_ROUTE = {400: "more than one Authorization header", 503: "at ARBITER_MAX_CONCURRENCY"}
_CHAT_STATUSES = {status: when for status, when in _STATUSES.items() if status != 405} | {
    400: "a body that is not JSON or not an object, a model without the completion capability, a chat API "
         "the model's backend does not speak, remote media URLs; more than one Authorization header",
}
_MULTIPART = {"type": "object", "required": ["request"],
              "properties": {"request": {"type": "string", "contentMediaType": "application/json",
                                         "description": "the JSON request, its images named by reference"}},
              "additionalProperties": {"type": "string", "format": "binary",
                                       "description": "an image the request part names"}}


def systemone() -> dict[str, Any]:
    """The placeholder route's keyword arguments for ``POST /v1/systemone``: JSON, or multipart
    the way TypeSafe's SDK sends images (SPEC §1)."""
    return _route({"application/json": {"schema": SYSTEMONE_REQUEST}, "multipart/form-data": {"schema": _MULTIPART}},
                  {200: {"model": SystemOneAnswer,
                         "description": "the backend's answer as it came, with model set to the name the caller used"},
                   **_errors(_STATUSES)})


def openai_decisions() -> dict[str, Any]:
    """``POST /v1/decisions``: every error, Arbiter's or a backend's, in OpenAI's shape, but for
    the two that the middleware in front of every route answers in Arbiter's (app/api/middleware.py)."""
    errors: dict[int | str, dict[str, Any]] = {
        status: {"description": when, "model": OpenAIError, **_headers(status)} for status, when in _STATUSES.items()}
    openai_ref = {"$ref": "#/components/schemas/OpenAIError"}
    for status, before in _BEFORE_THE_ROUTE.items():
        errors[status] = {"description": f"{_STATUSES[status]} ({before}: Arbiter's Error)", **_headers(status),
                          "content": {"application/json": {"schema": {"anyOf": [openai_ref, ERROR_REF]}}}}
    passed_on = {"description": "a backend's own error, its status and message put into this shape",
                 "model": OpenAIError}
    return _route({"application/json": {"schema": OPENAI_DECISIONS_REQUEST}},
                  {200: {"model": DecisionAnswer, "description": "the answers, in question order"},
                   **errors, "4XX": passed_on, "5XX": passed_on})


def chat(path: str) -> dict[str, Any]:
    """A chat route: the backend's answer, whole (JSON) or streamed as it arrives (Server-Sent
    Events on /v1/chat/completions, Ollama's NDJSON on /api/chat)."""
    stream = "text/event-stream" if path.startswith("/v1/") else "application/x-ndjson"
    answer = {"description": "the backend's answer: JSON with model set to the name the caller used, or, "
                             "with \"stream\": true, the backend's stream chunk by chunk",
              "content": {"application/json": {"schema": {"type": "object"}}, stream: {"schema": {"type": "string"}}}}
    return _route({"application/json": {"schema": CHAT_REQUEST}}, {200: answer, **_errors(_CHAT_STATUSES)})


def _route(request: dict[str, Any], responses: dict[int | str, dict[str, Any]]) -> dict[str, Any]:
    return {"response_model": None, "responses": responses,
            "openapi_extra": {"requestBody": {"required": True, "content": request}, "security": SECURITY}}


def _errors(statuses: dict[int, str]) -> dict[int | str, dict[str, Any]]:
    """Arbiter's ``Error`` for each status (or the backend's own body), then the ranges for any
    other status a backend answers."""
    declared: dict[int | str, dict[str, Any]] = {}
    for status, when in statuses.items():
        schema = ERROR_REF if status in _ARBITERS_OWN else {"anyOf": [ERROR_REF, PASSED_ON]}
        declared[status] = {"description": when, "content": {"application/json": {"schema": schema}},
                            **_headers(status)}
    declared["4XX"] = declared["5XX"] = {**PASSED_ON, "content": {"*/*": {"schema": {}}}}
    return declared


def _headers(status: int) -> dict[str, Any]:
    return {"headers": _HEADERS[status]} if status in _HEADERS else {}

