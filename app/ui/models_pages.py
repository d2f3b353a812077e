"""Models: the catalog with installs (progress, cancel, the mesh warning), custom models, and a
card for every installed model. The same calls as app/api/admin/models.py."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from sqlalchemy.orm import Session

from app.api.admin import playground
from app.api.admin.schemas import AliasCreate, ModelInstallRequest, ModelUpdate
from app.errors import InvalidRequest
from app.services import aliases, catalog
from app.services import service as services
from app.tenancy.roles import Need
from app.text import ascii_digits
from app.ui.roles import permitted
from app.ui.web import (
    FORM_ERRORS,
    Admin,
    Form,
    UiRoute,
    by_id,
    components,
    decimal,
    drop_blank,
    error_summary,
    is_mesh_warning,
    mesh_guard,
    mesh_warning,
    message,
    posted,
    redirect,
    render,
    validated,
)

router = APIRouter(route_class=UiRoute)
NOTICES = {"registered": "Model registered; its card is below.", "installed": "Model installed; its card is below.",
           "cancelled": "Install cancelled.", "removed": "Model removed.", "renamed": "Model changed.",
           "alias-added": "Alias added.", "alias-removed": "Alias removed."}
CAPABILITY_CHOICES = sorted(catalog.CAPABILITIES)


async def _page(request: Request, admin: Admin, *, status: int = 200, errors: dict[str, str] | None = None,
                warning: dict[str, Any] | None = None, values: dict[str, str] | None = None,
                done: str = "", install: int | None = None, checked: list[str] | None = None,
                edit: int | None = None) -> Response:
    c = components(request)

    def work(s: Session) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
        return ([services.service_view(x) for x in services.list_services(s)],
                [services.model_view(m, x) for m, x in services.all_models(s)],
                [aliases.alias_view(a, c.registry.known) for a in aliases.list_aliases(s)])
    service_views, model_views, alias_views = await c.in_session(work)
    installs = await c.installer.recent(20)
    rows = _catalog(service_views)
    return render(request, "models.html", admin, status=status, catalog=rows,
                  services=service_views, cards=_cards(model_views), installs=installs,
                  installed=_installed(model_views), aliases=alias_views,
                  model_names=sorted({str(v["public_name"]) for v in model_views}),
                  gated=[s for s in service_views if not s["decisions_supported"]],
                  capability_choices=CAPABILITY_CHOICES, errors=errors or {}, warning=warning,
                  values=values or {}, checked=checked or [], notice=NOTICES.get(done), focus_install=install,
                  edit=edit, summary=_summary(errors or {}, rows), playground_state=playground.EXAMPLE_STATE,
                  playground_questions=playground.example_questions())


def _summary(errors: dict[str, str], rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The summary at the top of the page: a catalog row's error is ``install-<row number>-error``,
    as models.html numbers the rows, not its form's id ``install:<name>``."""
    return error_summary(errors, {f"install:{row['name']}": f"install-{n}" for n, row in enumerate(rows, 1)})


def _catalog(service_views: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for entry in catalog.entries():
        fits = [s for s in service_views if s["type"] in entry.services]
        rows.append({**entry.view(), "fits": fits,
                     "gated": [s for s in fits if entry.kind == "decision" and not s["decisions_supported"]]})
    return rows


def _installed(model_views: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Catalog name -> the services that have it already."""
    where: dict[str, list[str]] = {}
    for view in model_views:
        entry = catalog.find(view["backend_name"])
        if entry is not None:
            where.setdefault(entry.name, []).append(str(view["service"]))
    return where


def _cards(model_views: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One card per public name; services that share it are replicas of one model."""
    cards: dict[str, dict[str, Any]] = {}
    for view in model_views:
        card = cards.setdefault(view["public_name"], {"public_name": view["public_name"], "replicas": [],
                                                      "capabilities": set()})
        card["replicas"].append(view)
        card["capabilities"].update(view["capabilities"])
    for card in cards.values():
        card["capabilities"] = sorted(card["capabilities"])
        card["kind"] = catalog.model_kind(card["capabilities"])
    return list(cards.values())


@router.get("/models")
async def models_page(request: Request, done: str = "", install: int | None = None) -> Response:
    return await _page(request, await permitted(request, Need.READ), done=done, install=install)


@router.post("/models/install")
async def install(request: Request) -> Response:
    """A catalog model (form ``install:<name>``) or a custom one (form ``custom``)."""
    admin = await permitted(request, Need.OPERATE)
    form = await posted(request, admin)
    custom = form.get("form") == "custom"
    form_id = "custom" if custom else f"install:{form.get('model')}"
    c = components(request)
    try:
        body = _install_body(form, custom)
        service_id = _int(form.get("service"), "Choose a service to install on.")
        name = await c.in_session(lambda s: _service_name(s, service_id))
        # As POST /admin/services/{name}/models does: the mesh may warn first, unless confirmed.
        status, view = await c.installer.install(
            name, body.model_dump(exclude_none=True, exclude={"confirm"}), admin.actor,
            mesh_guard(c, body.confirm))
    except FORM_ERRORS as exc:
        if is_mesh_warning(exc):
            capabilities = form.getlist("capabilities")
            return await _page(request, admin, status=409, values=form.values(), checked=capabilities,
                               warning=mesh_warning(exc, "/ui/models/install", "Install anyway", "/ui/models",
                                                    form.values(), lists={"capabilities": capabilities}))
        return await _page(request, admin, status=400, errors={form_id: message(exc)}, values=form.values(),
                           checked=form.getlist("capabilities"))
    if status == 202:
        return redirect(f"/ui/models?install={view['id']}#install-{view['id']}")
    return redirect("/ui/models?done=registered#cards")


def _install_body(form: Form, custom: bool) -> ModelInstallRequest:
    fields: dict[str, Any] = {"model": form.get("model"), "public_name": form.get("public_name") or None,
                              "confirm": form.get("confirm") == "true"}  # "Install anyway", after the warning
    if custom:
        fields["capabilities"] = form.getlist("capabilities")
        if not fields["capabilities"]:
            raise InvalidRequest("Tick at least one capability of the custom model (a decision model: decision).")
    return validated(ModelInstallRequest, drop_blank(fields))


def _service_name(s: Session, service_id: int) -> str:
    gone = "That service does not exist any more; reload the page"
    return by_id(services.list_services(s), service_id, gone).name


def _int(raw: str, problem: str) -> int:
    if not ascii_digits(raw):
        raise InvalidRequest(problem)
    return int(raw)


# Before /models/{model_id}: that route would take "aliases" for a model id.
@router.post("/models/aliases")
async def add_alias(request: Request) -> Response:
    """As POST /admin/aliases: a second public name for a model."""
    admin = await permitted(request, Need.OPERATE)
    form = await posted(request, admin)
    c = components(request)
    try:
        body = validated(AliasCreate, drop_blank({"alias": form.get("alias"), "model": form.get("model")}))
        await c.in_session(lambda s: aliases.create_alias(s, admin.actor, body.alias, body.model, c.registry.known))
    except FORM_ERRORS as exc:
        return await _page(request, admin, status=400, errors={"alias": message(exc)}, values=form.values())
    await c.changed_models()
    return redirect("/ui/models?done=alias-added#aliases")


@router.post("/models/aliases/remove")
async def remove_alias(request: Request) -> Response:
    """As DELETE /admin/aliases/{alias} (the name in the form: an alias may hold a '/')."""
    admin = await permitted(request, Need.OPERATE)
    form = await posted(request, admin)
    c = components(request)
    name = form.get("alias")
    try:
        await c.in_session(lambda s: aliases.remove_alias(s, admin.actor, name))
    except FORM_ERRORS as exc:
        return await _page(request, admin, status=400, errors={"alias": message(exc)})
    await c.changed_models()
    return redirect("/ui/models?done=alias-removed#aliases")


@router.post("/models/installs/{install_id}/cancel")
async def cancel(request: Request, install_id: int) -> Response:
    admin = await permitted(request, Need.OPERATE)
    await posted(request, admin)
    try:
        await components(request).installer.cancel(install_id, admin.actor)
    except FORM_ERRORS as exc:
        return await _page(request, admin, status=400, errors={f"install-{install_id}": message(exc)})
    return redirect("/ui/models?done=cancelled")


@router.post("/models/{model_id}/uninstall")
async def uninstall(request: Request, model_id: int) -> Response:
    admin = await permitted(request, Need.OPERATE)
    await posted(request, admin)
    c = components(request)

    def names(s: Session) -> tuple[str, str]:
        model, service = services.get_model(s, model_id)
        return service.name, model.backend_name
    try:
        service_name, backend_name = await c.in_session(names)
        await c.installer.uninstall(service_name, backend_name, admin.actor)
    except FORM_ERRORS as exc:
        return await _page(request, admin, status=400, errors={f"model-{model_id}": message(exc)})
    return redirect("/ui/models?done=removed#cards")


@router.post("/models/{model_id}")
async def change(request: Request, model_id: int) -> Response:
    """Rename a model (services sharing a public name are replicas), set its own timeout, or turn
    label reading on or off."""
    admin = await permitted(request, Need.OPERATE)
    form = await posted(request, admin)
    c = components(request)
    try:
        fields: dict[str, Any] = {}
        if form.get("public_name"):
            fields["public_name"] = form.get("public_name")
        if form.get("timeout"):
            fields["timeout"] = decimal(form, "timeout", "Timeout")
        if form.get("clear_timeout"):
            fields["timeout"] = None
        if form.get("read_strategy") in ("labels", "embeddings", "native"):
            strategy = form.get("read_strategy")
            fields["read_strategy"] = None if strategy == "native" else strategy
        if form.get("embedding_temperature"):
            fields["embedding_temperature"] = decimal(form, "embedding_temperature", "Similarity temperature")
        if not fields:
            raise InvalidRequest("Nothing to change: give a public name, a timeout or how it decides")
        changes = validated(ModelUpdate, fields).model_dump(exclude_unset=True)
        # As PATCH /admin/models/{id}: label reading makes a decision model, so the mesh may warn.
        guard = mesh_guard(c, form.get("confirm") == "true")
        await c.in_session(lambda s: services.update_model(s, model_id, admin.actor, changes, guard))
    except FORM_ERRORS as exc:
        if is_mesh_warning(exc):
            return await _page(request, admin, status=409, values=form.values(), edit=model_id,
                               warning=mesh_warning(exc, f"/ui/models/{model_id}", "Save anyway",
                                                    "/ui/models#cards", form.values()))
        return await _page(request, admin, status=400, errors={f"model-{model_id}": message(exc)},
                           values=form.values(), edit=model_id)
    await c.changed_models()
    return redirect("/ui/models?done=renamed#cards")

