"""The JSON the web UI's scripts fetch: install progress, the Test action and the playground.
Protected by the session cookie, and POSTs by the X-CSRF-Token header as well."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request

from app import jsonbody
from app.api.admin import models as admin_models
from app.api.admin import playground
from app.decisions.body import check_length
from app.decisions.offloop import OFF_LOOP_BYTES
from app.decisions.schema import DecisionRequest
from app.errors import InvalidRequest, TooLarge
from app.services import service as services
from app.services.catalog import model_kind
from app.tenancy.roles import Need
from app.ui.roles import permitted
from app.ui.web import UiRoute, check_csrf_header, components

router = APIRouter(route_class=UiRoute)


@router.get("/api/installs/{install_id}")
async def install_progress(request: Request, install_id: int) -> dict[str, Any]:
    await permitted(request, Need.READ)
    return await components(request).installer.get(install_id)


@router.post("/api/models/{model_id}/test")
async def test_model(request: Request, model_id: int) -> dict[str, Any]:
    """The model card's Test action: ``POST /admin/models/{id}/test`` itself, run as this admin."""
    admin = await permitted(request, Need.OPERATE)
    check_csrf_header(request, admin)
    return await admin_models.test_model(model_id, admin.actor, components(request))


@router.post("/api/models/{model_id}/playground")
async def run_playground(request: Request, model_id: int) -> dict[str, Any]:
    """The model card's playground: ``{"state": text, "questions": text}`` asked as a decision
    (app/api/admin/playground.py), under the API's body cap; the operate role, as Test."""
    admin = await permitted(request, Need.OPERATE)
    check_csrf_header(request, admin)
    c = components(request)
    raw = await _body(request, c.settings.max_body_bytes)
    public_name, service_id, capabilities = await c.in_session(lambda s: services.card_target(s, model_id))
    if model_kind(capabilities) != "decision":
        raise InvalidRequest(f"{public_name} does not answer decisions; the playground is for decision models")
    if len(raw) <= OFF_LOOP_BYTES:
        body, decision = _parsed(public_name, raw)
    else:  # a big one is parsed in a worker, as the API parses one off the event loop
        body, decision = await asyncio.to_thread(_parsed, public_name, raw)
    return await playground.run(c.forwarder, c.observer, public_name=public_name, service_id=service_id,
                                body=body, request=decision, request_id=admin.actor.request_id)


async def _body(request: Request, limit: int) -> bytes:
    """The request body, read until ``limit`` (the API's ARBITER_MAX_BODY_BYTES): 413 past it,
    with the API's words; a Content-Length over it before anything is read."""
    check_length(request.headers.get("content-length"), limit)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise TooLarge(f"the body is over the {limit}-byte limit")
    return bytes(body)


def _parsed(public_name: str, raw: bytes) -> tuple[dict[str, Any], DecisionRequest]:
    """The form's two texts, from the script's JSON, made the decision they ask (400 otherwise)."""
    fields = jsonbody.loads(raw)
    if not isinstance(fields, dict) or not all(isinstance(fields.get(k), str) for k in ("state", "questions")):
        raise InvalidRequest('send {"state": text, "questions": text}, both strings')
    return playground.request_of(public_name, fields["state"], fields["questions"])
