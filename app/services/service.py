"""Services and their models: add, sync, list. Shared by the admin API and the CLI."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from app import audit
from app.db.models import Model, Service, utcnow
from app.errors import Conflict, InvalidRequest, NotFound
from app.services import versions
from app.services.backends import make_backend
from app.settings import Settings
from app.tenancy.service import Actor
from infra_adapters.base import BackendError, RemoteModel
from infra_adapters.ollama import public_name

_OLLAMA_TYPES = ("ollama", "ollama-external")


def check_url(url: str) -> str:
    parts = urlsplit(url or "")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidRequest(f"service url must be an http(s):// URL, not {url!r}")
    return url.rstrip("/")


def default_name(service_type: str, url: str) -> str:
    host = urlsplit(url)
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{service_type}-{host.hostname}-{host.port or ''}").strip("-")


def add_service(session: Session, settings: Settings, actor: Actor, *, type: str, url: str,
                name: str | None = None, credential: str | None = None,
                text_limit: int | None = None) -> Service:
    """Register a backend, read its version and its models. An unreachable URL is a 400."""
    url = check_url(url)
    backend = make_backend(type, url, credential, settings)
    name = name or default_name(type, url)
    if session.scalar(select(Service).where(Service.name == name)):
        raise Conflict(f"service '{name}' already exists")
    if text_limit is not None and text_limit <= 0:
        raise InvalidRequest("text_limit must be a positive number of bytes")
    service = Service(name=name, type=type, url=url, credential=credential,
                      text_limit=text_limit or settings.default_text_limit, skipped_models=[])
    session.add(service)
    session.flush()
    try:
        remote = _read(backend, service)
    except BackendError as exc:
        raise InvalidRequest(f"cannot add service '{name}': {exc}") from exc
    _register(session, service, remote)
    audit.record(session, actor=actor.name, action="service.create", target=f"service:{name}",
                 request_id=actor.request_id, details={"type": type, "url": url})
    return service


def sync_service(session: Session, settings: Settings, service: Service,
                 actor: Actor | None = None) -> None:
    """Re-read a service's version and models; errors land in its status, not in an exception.
    With an ``actor`` (an admin pressed Refresh) the refresh and its outcome are audited."""
    backend = make_backend(service.type, service.url, service.credential, settings)
    before = sorted(m.backend_name for m in service_models(session, service))
    try:
        remote = _read(backend, service)
    except BackendError as exc:
        service.reachable = False
        service.last_error = str(exc)
    else:
        _register(session, service, remote)
    if actor is not None:
        session.flush()
        after = sorted(m.backend_name for m in service_models(session, service))
        audit.record(session, actor=actor.name, action="service.refresh", target=f"service:{service.name}",
                     request_id=actor.request_id,
                     details={"version": service.version, "reachable": service.reachable,
                              "added": sorted(set(after) - set(before)),
                              "removed": sorted(set(before) - set(after))})


def _read(backend: Any, service: Service) -> list[RemoteModel]:
    service.version = backend.read_version()
    models = backend.list_models()
    service.reachable = True
    service.last_error = None
    service.last_sync_at = utcnow()
    return models


def _register(session: Session, service: Service, remote: list[RemoteModel]) -> None:
    version = service.version_override or service.version
    gated = service.type in _OLLAMA_TYPES and not versions.supports_decisions(version)
    skipped: list[dict[str, str]] = []
    wanted: dict[str, RemoteModel] = {}
    for model in remote:
        if gated and "decision" in model.capabilities:
            skipped.append({"model": _public(service.type, model.name), "backend_name": model.name,
                            "reason": versions.gate_message(version)})
            continue
        wanted[model.name] = model
    existing = {m.backend_name: m for m in session.scalars(select(Model).where(Model.service_id == service.id))}
    for backend_name, row in existing.items():
        if backend_name not in wanted and row.source == "sync":
            session.delete(row)
    for backend_name, model in wanted.items():
        known = existing.get(backend_name)
        if known is None:
            session.add(Model(service_id=service.id, backend_name=backend_name,
                              public_name=_public(service.type, backend_name),
                              capabilities=sorted(model.capabilities), source="sync"))
        else:
            known.capabilities = sorted(model.capabilities)
    service.skipped_models = skipped


def _public(service_type: str, backend_name: str) -> str:
    return public_name(backend_name) if service_type in _OLLAMA_TYPES else backend_name


def get_service(session: Session, name: str) -> Service:
    service = session.scalar(select(Service).where(Service.name == name))
    if service is None:
        raise NotFound(f"service '{name}' does not exist")
    return service


def remove_service(session: Session, name: str, actor: Actor) -> None:
    service = get_service(session, name)
    session.execute(delete(Model).where(Model.service_id == service.id))
    session.delete(service)
    audit.record(session, actor=actor.name, action="service.delete", target=f"service:{name}",
                 request_id=actor.request_id)


def list_services(session: Session) -> list[Service]:
    return list(session.scalars(select(Service).order_by(Service.name)))


def service_models(session: Session, service: Service) -> list[Model]:
    return list(session.scalars(select(Model).where(Model.service_id == service.id).order_by(Model.public_name)))


def service_view(service: Service) -> dict[str, Any]:
    """A service as the admin API shows it: never its credential."""
    return {
        "id": service.id, "name": service.name, "type": service.type, "url": service.url,
        "has_credential": bool(service.credential), "text_limit": service.text_limit,
        "version": service.version, "version_override": service.version_override,
        "reachable": service.reachable,
        "decisions_supported": (versions.supports_decisions(service.version_override or service.version)
                                if service.type in _OLLAMA_TYPES else True),
        "last_sync_at": _iso(service.last_sync_at),
        "last_error": service.last_error, "skipped_models": service.skipped_models,
    }


def _iso(value: dt.datetime | None) -> str | None:
    if value is not None and value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)  # SQLite drops the zone; Arbiter stores UTC
    return value.isoformat() if value else None


def model_view(model: Model, service: Service | None = None) -> dict[str, Any]:
    return {"id": model.id, "public_name": model.public_name, "backend_name": model.backend_name,
            "capabilities": model.capabilities, "source": model.source,
            "service": service.name if service else model.service_id}


def all_models(session: Session) -> list[tuple[Model, Service]]:
    rows = session.execute(select(Model, Service).join(Service, Service.id == Model.service_id)
                           .order_by(Model.public_name, Service.name))
    return [(m, s) for m, s in rows]
