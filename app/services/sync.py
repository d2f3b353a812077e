"""Reading a backend (version, models) and registering what it serves, with version gating."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app import audit
from app.db import lease
from app.db.models import Model, Service, utcnow
from app.db.session import Database
from app.routing.backends import make_backend
from app.routing.credentials import CredentialBox, CredentialUnavailable
from app.services import catalog, versions
from app.settings import Settings
from app.tenancy.service import Actor
from infra_adapters.base import (
    AdminCallAbandoned,
    Backend,
    BackendAuthRejected,
    BackendError,
    BackendProtocolError,
    RemoteModel,
)
from infra_adapters.http import AdminCalls, admin_calls
from infra_adapters.ollama import public_name

log = logging.getLogger("arbiter.sync")
OLLAMA_TYPES = ("ollama", "ollama-external")
LEASE = "service-sync"


def backend_for(service: Service, settings: Settings) -> Backend:
    credential = CredentialBox.from_settings(settings).open(service.credential)
    return make_backend(service.type, service.url, credential, settings,
                        salts_prefix_cache=salts_prefix_cache(service))


def salts_prefix_cache(service: Service) -> bool:
    """Whether requests to this service carry the project's ``cache_salt`` (SPEC §1), so tenants
    do not share its prefix cache: a vLLM, also one added as an ``openai`` service (an ``openai``
    service has a version only when its ``GET /version`` answered as vLLM's does)."""
    return service.type == "vllm" or (service.type == "openai" and service.version is not None)


SHARED_PREFIX_CACHE = ("This OpenAI-compatible server is not a vLLM (its /version did not answer as vLLM's does), "
                       "so Arbiter cannot give each project its own prompt cache there: tenants share it, and "
                       "one may time another's prompts.")


def prefix_cache_message(service: Service) -> str | None:
    """The one line a service's status says when its tenants share a prefix cache Arbiter cannot salt."""
    return SHARED_PREFIX_CACHE if service.type == "openai" and not salts_prefix_cache(service) else None


def gated(service: Service) -> bool:
    """True when this service's Ollama is too old for decision models."""
    return service.type in OLLAMA_TYPES and not versions.supports_decisions(effective_version(service))


def effective_version(service: Service) -> str | None:
    return service.version_override or service.version


def public(service_type: str, backend_name: str) -> str:
    return public_name(backend_name) if service_type not in ("vllm", "openai") else backend_name


def read(session: Session, settings: Settings, service: Service) -> list[RemoteModel]:
    """Read the version and the models; raises BackendError (the caller decides what that means).
    A version the backend answers but that cannot be read (a 404, not JSON) is no version: the
    gate closes (SPEC §4), the models are still read, and ``last_error`` says why."""
    try:
        backend = backend_for(service, settings)
    except CredentialUnavailable as exc:
        raise BackendError(str(exc)) from exc
    problem = None
    try:
        service.version = backend.read_version()
    except BackendAuthRejected:
        raise
    except BackendProtocolError as exc:
        service.version = None
        problem = f"cannot read the version: {exc}"
    models = backend.list_models()
    service.reachable = True
    service.last_error = problem
    service.last_sync_at = utcnow()
    return models


def sync_service(session: Session, settings: Settings, service: Service, actor: Actor | None = None) -> None:
    """Re-read a service's version and models; errors land in its status, not in an exception.
    With an ``actor`` (an admin pressed Refresh) the refresh and its outcome are audited."""
    # Changes made to the service so far (a new URL or key) are written after the read, not before:
    # a slow backend must not hold the database's write lock (SQLite has one for everybody).
    with session.no_autoflush:
        before = _names(session, service)
        try:
            remote: list[RemoteModel] | None = read(session, settings, service)
        except AdminCallAbandoned:
            raise  # about this process stopping, not the service: its status stays as it was
        except BackendError as exc:
            service.reachable = False
            service.last_error = str(exc)
            remote = None
    if remote is not None:
        register(session, service, remote)
    if actor is not None:
        session.flush()
        after = _names(session, service)
        audit.record(session, actor=actor.name, action="service.refresh", target=f"service:{service.name}",
                     request_id=actor.request_id,
                     details={"version": service.version, "reachable": service.reachable,
                              "added": sorted(set(after) - set(before)),
                              "removed": sorted(set(before) - set(after))})


def _names(session: Session, service: Service) -> list[str]:
    return sorted(session.scalars(select(Model.backend_name).where(Model.service_id == service.id)))


def capabilities_of(service_type: str, model: RemoteModel) -> list[str]:
    """What the backend says, plus what the catalog says of the model (SPEC §4)."""
    caps = set(model.capabilities)
    entry = catalog.find(model.name)
    if entry is not None and service_type in entry.services:
        caps |= set(entry.capabilities)
    return sorted(caps)


def register(session: Session, service: Service, remote: list[RemoteModel]) -> None:
    """Make the service's model rows match what it serves. Custom rows are the admin's: kept.

    While the service is too old for decision models (SPEC §4), its decision models are skipped:
    one not registered yet is left out, one registered already keeps its row (its public name,
    timeout and id are the admin's) and is gated: requests for it get 405 until the gate lifts.

    A model the backend lists but cannot describe (``unreadable``: its Ollama's /api/show failed)
    is skipped the same way, with why: left out when new, its row kept as last synced otherwise
    (a model that fails to load is not forgotten for it), and the others are synced."""
    too_old = gated(service)
    reason = versions.gate_message(effective_version(service))
    rows = {m.backend_name: m for m in session.scalars(select(Model).where(Model.service_id == service.id))}
    skipped: list[dict[str, str]] = []
    for model in remote:
        if model.unreadable is not None:
            row = rows.get(model.name)
            skipped.append({"model": row.public_name if row is not None else public(service.type, model.name),
                            "backend_name": model.name, "reason": model.unreadable})
    wanted = {model.name: capabilities_of(service.type, model) for model in remote if model.unreadable is None}
    listed = {model.name for model in remote}
    for backend_name, caps in wanted.items():
        row = rows.get(backend_name)
        if row is not None and row.source != "custom":
            row.capabilities = caps
        if too_old and "decision" in (row.capabilities if row is not None else caps):
            skipped.append({"model": row.public_name if row is not None else public(service.type, backend_name),
                            "backend_name": backend_name, "reason": reason})
        elif row is None:
            session.add(Model(service_id=service.id, backend_name=backend_name,
                              public_name=public(service.type, backend_name), capabilities=caps, source="sync"))
    for backend_name, row in rows.items():
        if backend_name in listed:
            continue
        if row.source != "custom":
            session.delete(row)
        elif too_old and "decision" in row.capabilities:
            skipped.append({"model": row.public_name, "backend_name": backend_name, "reason": reason})
    service.skipped_models = skipped


def gate_of(model: Model, service: Service) -> str | None:
    """Why ``model`` cannot answer decisions on ``service`` right now (its Ollama is too old), or None."""
    if "decision" in model.capabilities and gated(service):
        return versions.gate_message(effective_version(service))
    return None


class SyncLoop:
    """Reads every service at start-up and then on a schedule (versions and models)."""

    def __init__(self, database: Database, settings: Settings, on_change: Callable[[], Any]) -> None:
        self._database = database
        self._settings = settings
        self._on_change = on_change
        self.runs = 0  # syncs this process ran (the lease makes other replicas skip theirs)
        # A sync runs in a worker thread, which cancelling its task does not stop: at shutdown its
        # admin calls are given up (the one under way, and any after it), it reads no further
        # service, and it is waited for (it writes to the database, which closes next).
        self._calls = AdminCalls()
        self._idle = threading.Event()
        self._idle.set()

    def sync_all(self) -> None:
        self._idle.clear()
        owner = admin_calls.set(self._calls)  # the calls made from here on are the sync's
        try:
            with self._database.session() as session:
                ids = list(session.scalars(select(Service.id)))
            for service_id in ids:
                if self._calls.abandoned:
                    return  # shutting down: the next start reads every service again
                try:
                    with self._database.session() as session:
                        service = session.get(Service, service_id)
                        if service is not None:
                            sync_service(session, self._settings, service)
                except AdminCallAbandoned:
                    return  # stopping: nothing written for it
                except Exception:  # one broken service must not stop the others' sync
                    log.exception("scheduled sync of service %s failed", service_id)
        finally:
            admin_calls.reset(owner)  # not the caller's any more, whatever thread or context this was
            self._idle.set()

    def stop(self) -> None:
        """No service is read after this, and the admin call under way is given up."""
        self._calls.abandon()

    def wait_idle(self, timeout: float) -> bool:
        """Until no sync runs (at most ``timeout`` seconds): whether none does."""
        return self._idle.wait(timeout)

    async def run(self, interval: float) -> None:
        """Sync at start-up, whoever holds the ``service-sync`` lease (SPEC §4: the version is read
        when Arbiter starts; a read is safe to repeat, and the holder may be a process that was
        killed and keeps the lease until it runs out), then on one replica at a time: the holder."""
        started = False
        while True:
            try:
                held = await asyncio.to_thread(lease.try_hold, self._database, LEASE, max(interval * 2.5, 30.0))
                if held or not started:
                    await asyncio.to_thread(self.sync_all)
                    started = True
                    self.runs += 1
                    await self._on_change()
            except Exception:  # the database may be away: try again next time
                log.exception("scheduled sync failed")
            await asyncio.sleep(interval)

    def release(self) -> None:
        lease.release(self._database, LEASE)
