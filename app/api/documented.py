"""How a route documents what it answers: its answer's model and its own refusals, for the
OpenAPI document only.

A route's answer is built by its view functions (``project_view``, ``service_view``, ...),
which are the one truth of what is sent. ``answer(Model)`` names the pydantic model that
describes it, and sets ``response_model=None``: FastAPI neither validates nor re-serialises the
handler's value, so a model that fell behind a view cannot turn a good answer into a 500, and
nothing of the answer changes (tests/api/test_openapi.py checks every real answer against its
model, strictly: a field the model does not name fails there). The errors every route of a
kind can answer (400, 401, 403, 404, ...) are declared centrally (app/api/openapi.py); a route
names only its own (a 409 for a taken name).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field


class ErrorDetail(BaseModel):
    error_type: str = Field(description="invalid_request_error, authentication_error, permission_error, "
                                        "not_found_error, conflict_error, rate_limit_error, backend_error, ...")
    message: str = Field(description="the same sentence as error")


class Problem(BaseModel):
    """One problem of a body or parameter that breaks the rules."""

    loc: list[str | int] = Field(description="where: body, path, query or header, then the field's path")
    msg: str
    type: str


class Error(BaseModel):
    """Every error Arbiter makes (SPEC §1): ``error`` is a sentence (what Ollama's clients read),
    ``detail`` the same as an object (FastAPI-style and TypeSafe clients), or, for a body or a
    parameter that breaks the rules, the list of every problem found (``error`` names the first)."""

    error: str
    detail: ErrorDetail | list[Problem]


def answer(model: type[BaseModel] | None, status: int = 200, errors: Mapping[int, str] | None = None, *,
           also: Mapping[int, tuple[type[BaseModel], str]] | None = None) -> dict[str, Any]:
    """The keyword arguments of a route that answers ``model`` with ``status`` (None: no body,
    a 204), documented only. ``errors``: the route's own refusals beyond those of every route of
    its kind, status -> when; ``also``: another status it answers with a body of its own,
    status -> (model, when)."""
    responses: dict[int | str, dict[str, Any]] = {}
    if model is not None:
        responses[status] = {"model": model}
    for code, (other, when) in (also or {}).items():
        responses[code] = {"description": when, "model": other}
    for code, when in (errors or {}).items():
        responses[code] = {"description": when, "model": Error}
    return {"status_code": status, "response_model": None, "responses": responses}
