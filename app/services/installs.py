"""Installing models: a catalog or custom model pulled onto an Ollama (a job with progress
and cancel), registered on a vLLM or Ollama Cloud service, or removed again."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app import audit
from app.db.models import Model, ModelInstall, Service, utcnow
from app.db.session import Database
from app.db.timestamps import as_utc, iso
from app.errors import Conflict, InvalidRequest, NotFound
from app.services import catalog, sync, versions
from app.services import service as services
from app.services.sync import OLLAMA_TYPES, backend_for, effective_version, gated, public
from app.settings import Settings
from app.tenancy.service import Actor
from infra_adapters.admin import AdminClient
from infra_adapters.base import BackendAuthRejected, BackendError, CallOptions
from infra_adapters.ollama import OllamaBackend

log = logging.getLogger("arbiter.installs")
_PROGRESS_EVERY = 0.25  # seconds between progress writes
FINISHED = ("succeeded", "failed", "cancelled")
REMOVED_ELSEWHERE = ("was changed while '{name}' was being removed from its backend: it was removed from the one "
                     "the service pointed at before, and its row here is kept; Refresh the service to see what "
                     "the new one serves")


@dataclass(frozen=True)
class Plan:
    """What an install request turned into once checked."""

    backend_name: str
    public_name: str
    capabilities: list[str]
    source: str  # catalog or custom
    pull: bool  # an Ollama pull job, or a registration at once


def plan(session: Session, settings: Settings, service: Service, request: dict[str, Any],
         offered: set[str] | None = None) -> Plan:
    """Check an install request against the catalog, the service type and version gating; and,
    on a service that registers rather than pulls, against what it ``offered`` (its model list,
    read beforehand with no transaction open; None: not read yet, not checked)."""
    name = request.get("model")
    if not isinstance(name, str) or not name.strip():
        raise InvalidRequest("model must be a non-empty model name")
    entry = catalog.find(name)
    declared = request.get("capabilities")
    if declared is not None:
        if (not isinstance(declared, list) or not declared
                or not all(isinstance(c, str) and c in catalog.CAPABILITIES for c in declared)):
            raise InvalidRequest(f"capabilities must be a non-empty list of: {', '.join(sorted(catalog.CAPABILITIES))}")
        caps = sorted(set(declared))
    elif entry is not None:
        caps = sorted(entry.capabilities)
    else:
        raise InvalidRequest(f"model '{name}' is not in the catalog; to add it as a custom model, "
                             "give its capabilities (for example [\"decision\"])")
    if entry is not None and declared is None and service.type not in entry.services:
        if service.type == "ollama-cloud":
            raise InvalidRequest(f"model '{entry.name}' is not offered by Ollama Cloud: it runs on a local Ollama only")
        if "ollama-cloud" in entry.services:
            raise InvalidRequest(f"model '{entry.name}' is hosted on Ollama Cloud; add an ollama-cloud service for it")
        raise InvalidRequest(f"model '{entry.name}' cannot be installed on a {service.type} service")
    if service.type in OLLAMA_TYPES:
        if "decision" in caps and gated(service):
            raise InvalidRequest(versions.gate_message(effective_version(service)))
        backend_name = name if ":" in name else f"{name}:latest"
    else:
        backend_name = name
        if offered is not None and backend_name not in offered:
            where = "Ollama Cloud does not host" if service.type == "ollama-cloud" else "this vLLM does not serve"
            raise InvalidRequest(f"{where} '{name}'; it offers: {', '.join(sorted(offered)) or 'nothing'}")
    if len(backend_name) > 200:
        raise InvalidRequest(f"model name '{backend_name}' is longer than 200 characters")
    public_name = request.get("public_name") or public(service.type, backend_name)
    if not isinstance(public_name, str) or len(public_name) > 200:
        raise InvalidRequest("public_name must be a string of at most 200 characters")
    existing = session.scalar(select(Model).where(Model.service_id == service.id, Model.backend_name == backend_name))
    if existing is not None and (service.type in OLLAMA_TYPES or existing.source == "custom"):
        raise Conflict(f"model '{backend_name}' is already installed on service '{service.name}'")
    running = session.scalar(select(ModelInstall).where(
        ModelInstall.service_id == service.id, ModelInstall.backend_name == backend_name,
        ModelInstall.status == "running"))
    if running is not None and not reap(running, settings.install_lease):
        raise Conflict(f"model '{backend_name}' is being installed already (install {running.id})")
    return Plan(backend_name, public_name, caps, "custom" if declared is not None else "catalog",
                pull=service.type in OLLAMA_TYPES)


def register(session: Session, service: Service, planned: Plan) -> Model:
    row = session.scalar(select(Model).where(Model.service_id == service.id,
                                             Model.backend_name == planned.backend_name))
    if row is None:
        row = Model(service_id=service.id, backend_name=planned.backend_name)
        session.add(row)
    row.public_name = planned.public_name
    row.capabilities = planned.capabilities
    row.source = "custom" if service.type not in OLLAMA_TYPES and planned.source == "custom" else planned.source
    session.flush()
    return row


def reap(job: ModelInstall, lease: float) -> bool:
    """End a running job that no live process runs any more (its process was killed, its node
    lost): one not refreshed for ``lease`` seconds. True when it was ended here."""
    if job.status != "running" or as_utc(job.updated_at) > utcnow() - dt.timedelta(seconds=lease):
        return False
    job.status, job.finished_at = ("cancelled" if job.cancel_requested else "failed"), utcnow()
    if job.status == "failed":
        job.error = (f"the process running this install stopped (nothing from it for over {lease:g}s); "
                     "install the model again")
    return True


def install_view(install: ModelInstall, service_name: str | None = None) -> dict[str, Any]:
    return {"id": install.id, "service": service_name or install.service_id, "model": install.backend_name,
            "public_name": install.public_name, "capabilities": install.capabilities,
            "status": install.status, "stage": install.stage, "percent": round(install.percent, 1),
            "error": install.error, "started_at": iso(install.started_at),
            "finished_at": iso(install.finished_at)}


def _find_job(session: Session, install_id: int) -> ModelInstall | None:
    return session.get(ModelInstall, install_id) if 0 < install_id <= services.MAX_ROW_ID else None


class Installer:
    """Runs pull jobs in this process; their state lives in the database for every replica."""

    def __init__(self, database: Database, settings: Settings, on_change: Callable[[], Awaitable[None]],
                 admin: AdminClient | None = None) -> None:
        self._database = database
        self._settings = settings
        self._on_change = on_change
        self._admin = admin
        self._tasks: dict[int, asyncio.Task[None]] = {}

    async def install(self, service_name: str, request: dict[str, Any], actor: Actor,
                      guard: Callable[[list[str]], None] | None = None) -> tuple[int, dict[str, Any]]:
        """(201, model) for a registration; (202, install) for a pull that has started. ``guard``
        sees the model's capabilities first and may refuse (the mesh's warning). A service that
        registers is asked what it serves with no transaction open, between two that check."""
        def check(session: Session) -> tuple[sync.Endpoint, bool]:
            service = services.get_service(session, service_name)
            planned = plan(session, self._settings, service, request)
            return sync.Endpoint.of(service), planned.pull

        endpoint, pull = await self._database.in_session(check)
        offered = None if pull else await self._offered(endpoint, service_name)

        def work(session: Session) -> tuple[int, dict[str, Any]]:
            service = services.get_service(session, service_name)
            if offered is not None:  # what the service offered is about the backend it pointed at
                sync.checked(session, service, endpoint)
            planned = plan(session, self._settings, service, request, offered)
            if guard is not None:
                guard(list(planned.capabilities))
            target = f"model:{service.name}/{planned.backend_name}"
            audit.record(session, actor=actor.name, action="model.install", target=target,
                         request_id=actor.request_id,
                         details={"capabilities": planned.capabilities, "source": planned.source})
            if not planned.pull:
                return 201, services.model_view(register(session, service, planned), service)
            job = ModelInstall(service_id=service.id, backend_name=planned.backend_name,
                               public_name=planned.public_name, capabilities=planned.capabilities,
                               source=planned.source, actor=actor.name)
            session.add(job)
            session.flush()
            return 202, install_view(job, service.name)

        status, view = await self._database.in_session(work)
        if status == 202:
            self._tasks[view["id"]] = asyncio.create_task(self._run(view["id"]))
        else:
            await self._on_change()
        return status, view

    async def _offered(self, endpoint: sync.Endpoint, service_name: str) -> set[str]:
        try:
            return {m.name for m in await backend_for(endpoint, self._settings, self._admin).list_models()}
        except BackendAuthRejected as exc:
            raise InvalidRequest(f"cannot install on service '{service_name}': {exc}") from exc
        except BackendError as exc:  # one message for every way it fails, as a service's read (sync.not_a_backend)
            raise InvalidRequest(f"cannot install on service '{service_name}': "
                                 f"{sync.not_a_backend(endpoint, exc)}") from exc

    async def _run(self, install_id: int) -> None:
        try:
            await self._leased(install_id, self._pull(install_id))
            # The model is registered and the registry reloaded before the job says "succeeded":
            # a client that sees it succeed and sends a request at once finds the model.
            await asyncio.to_thread(self._register, install_id)
            await self._on_change()
            await asyncio.to_thread(self._finish, install_id, "succeeded", None)
        except asyncio.CancelledError:
            await asyncio.to_thread(self._finish, install_id, "cancelled", None)
        except BackendError as exc:
            await asyncio.to_thread(self._finish, install_id, "failed", str(exc))
        except Exception as exc:  # a job must end in a state the UI can show, whatever happened
            log.exception("install %s failed", install_id)
            await asyncio.to_thread(self._finish, install_id, "failed", f"internal error: {type(exc).__name__}")
        finally:
            self._tasks.pop(install_id, None)

    async def _leased(self, install_id: int, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` (the pull) while keeping the job's lease: refreshed every sixth of it, even
        while Ollama says nothing (as while it verifies a big model's digest). The pull is cancelled
        when a cancel was asked for elsewhere, or another replica gave the job up."""
        pull = asyncio.ensure_future(work)
        try:
            while not pull.done():
                await asyncio.wait({pull}, timeout=self._settings.install_lease / 6)
                if not pull.done() and await self._refresh(install_id):
                    pull.cancel()
            await pull
        finally:
            if not pull.done():  # this task was cancelled: so is the pull
                pull.cancel()
                await asyncio.gather(pull, return_exceptions=True)

    async def _refresh(self, install_id: int) -> bool:
        try:
            return await asyncio.to_thread(self._touch, install_id)
        except Exception:  # the database away for a moment: the lease leaves room for it
            log.warning("could not refresh install %s", install_id, exc_info=True)
            return False

    async def _pull(self, install_id: int) -> None:
        def load(session: Session) -> tuple[ModelInstall, Service]:
            job = session.get_one(ModelInstall, install_id)
            return job, session.get_one(Service, job.service_id)

        job, service = await self._database.in_session(load)
        backend = backend_for(sync.Endpoint.of(service), self._settings)
        if not isinstance(backend, OllamaBackend):
            raise BackendError(f"service '{service.name}' cannot pull models")
        options = CallOptions(timeout=max(self._settings.backend_timeout, 300), max_reply_bytes=1 << 20,
                              streaming=True)
        stage, percent, last_write, written = "pulling manifest", 0.0, 0.0, ""
        try:
            async for progress in backend.pull(job.backend_name, options):
                stage = str(progress.get("status", stage))[:200]
                total, completed = progress.get("total"), progress.get("completed")
                if isinstance(total, int) and total > 0 and isinstance(completed, int):
                    percent = min(99.0, 100.0 * completed / total)
                now = time.monotonic()
                # A new stage at once: Ollama may say nothing for long after it ("verifying").
                if now - last_write >= _PROGRESS_EVERY or stage != written:
                    last_write, written = now, stage
                    if await asyncio.to_thread(self._progress, install_id, stage, percent):
                        raise asyncio.CancelledError()  # another replica asked to cancel
        finally:
            await backend.aclose()
        if stage != "success":
            raise BackendError(f"pull of {job.backend_name} ended before Ollama said success (at '{stage}')")

    def _progress(self, install_id: int, stage: str, percent: float) -> bool:
        """Write progress (it refreshes the lease too); True when the job must stop."""
        with self._database.session() as session:
            job = session.get_one(ModelInstall, install_id)
            job.stage, job.percent, job.updated_at = stage, percent, utcnow()
            return job.cancel_requested or job.status != "running"

    def _touch(self, install_id: int) -> bool:
        """Refresh the lease; True when the job must stop."""
        with self._database.session() as session:
            job = session.get_one(ModelInstall, install_id)
            job.updated_at = utcnow()
            return job.cancel_requested or job.status != "running"

    def _finish(self, install_id: int, status: str, error: str | None) -> None:
        with self._database.session() as session:
            job = session.get_one(ModelInstall, install_id)
            if job.status in FINISHED:
                return  # given up already (reaped while this process could not refresh it)
            job.status, job.error, job.finished_at, job.updated_at = status, error, utcnow(), utcnow()
            if status == "succeeded":
                job.percent, job.stage = 100.0, "success"

    def _register(self, install_id: int) -> None:
        """The pulled model's row, unless the job was given up meanwhile."""
        with self._database.session() as session:
            job = session.get_one(ModelInstall, install_id)
            if job.status in FINISHED:
                return
            service = session.get_one(Service, job.service_id)
            register(session, service, Plan(job.backend_name, job.public_name, list(job.capabilities),
                                            job.source, pull=True))

    async def cancel(self, install_id: int, actor: Actor) -> dict[str, Any]:
        def work(session: Session) -> dict[str, Any]:
            job = _find_job(session, install_id)
            if job is None:
                raise NotFound(f"install {install_id} does not exist")
            if job.status in FINISHED:
                raise Conflict(f"install {install_id} has already {job.status}")
            job.cancel_requested = True  # seen by the process that runs it at its next write
            reap(job, self._settings.install_lease)  # none does any more: cancelled now
            audit.record(session, actor=actor.name, action="model.install_cancel",
                         target=f"install:{install_id}:{job.backend_name}", request_id=actor.request_id)
            return install_view(job)

        view = await self._database.in_session(work)
        task = self._tasks.get(install_id)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            view = await self.get(install_id)
        return view

    async def get(self, install_id: int) -> dict[str, Any]:
        def work(session: Session) -> dict[str, Any]:
            job = _find_job(session, install_id)
            if job is None:
                raise NotFound(f"install {install_id} does not exist")
            reap(job, self._settings.install_lease)
            service = session.get(Service, job.service_id)
            return install_view(job, service.name if service else None)
        return await self._database.in_session(work)

    async def recent(self, limit: int = 50) -> list[dict[str, Any]]:
        def work(session: Session) -> list[dict[str, Any]]:
            rows = list(session.execute(select(ModelInstall, Service.name).join(Service)
                                        .order_by(ModelInstall.id.desc()).limit(limit)))
            for job, _ in rows:
                reap(job, self._settings.install_lease)
            return [install_view(job, name) for job, name in rows]
        return await self._database.in_session(work)

    async def uninstall(self, service_name: str, backend_name: str, actor: Actor) -> None:
        """Remove a model: from its Ollama first (with no transaction open), then its row."""
        def find(session: Session) -> tuple[Service, Model]:
            service = services.get_service(session, service_name)
            row = session.scalar(select(Model).where(
                Model.service_id == service.id,
                Model.backend_name.in_([backend_name, f"{backend_name}:latest"])))
            if row is None:
                raise NotFound(f"model '{backend_name}' is not installed on service '{service_name}'")
            if service.type not in OLLAMA_TYPES and row.source != "custom":
                raise InvalidRequest(f"'{row.backend_name}' is what the {service.type} service serves; "
                                     "remove it there, then Refresh the service")
            return service, row

        def check(session: Session) -> tuple[sync.Endpoint, str]:
            service, row = find(session)
            return sync.Endpoint.of(service), row.backend_name

        endpoint, name = await self._database.in_session(check)
        if endpoint.type in OLLAMA_TYPES:
            backend = backend_for(endpoint, self._settings, self._admin)
            try:
                await backend.delete(name)  # type: ignore[attr-defined]
            except BackendError as exc:
                raise InvalidRequest(f"cannot remove '{name}': {exc}") from exc

        def work(session: Session) -> None:
            service, row = find(session)
            if endpoint.type in OLLAMA_TYPES:  # removed from the backend the service pointed at
                sync.checked(session, service, endpoint, REMOVED_ELSEWHERE.format(name=name))
            audit.record(session, actor=actor.name, action="model.uninstall",
                         target=f"model:{service.name}/{row.backend_name}", request_id=actor.request_id)
            session.delete(row)

        await self._database.in_session(work)
        await self._on_change()

    async def aclose(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
