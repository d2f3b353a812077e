"""The JSON the web UI's scripts fetch: install progress and the Test action. Protected by the
session cookie, and POSTs by the X-CSRF-Token header as well."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from app.api.admin import models as admin_models
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
