"""Reading a backend (version, models) and registering what it serves, with version gating."""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from app import audit
from app.db import lease
from app.db.models import Model, Service, utcnow
from app.db.session import Database
from app.errors import Conflict, NotFound
from app.routing.backends import make_backend
from app.routing.credentials import CredentialBox, CredentialUnavailable
from app.services import catalog, versions
from app.settings import Settings
from app.tenancy.service import Actor
from infra_adapters.admin import AdminClient, shown_url
from infra_adapters.base import (
    Backend,
    BackendAuthRejected,
    BackendError,
    BackendProtocolError,
    RemoteModel,
)
from infra_adapters.ollama import public_name

log = logging.getLogger("arbiter.sync")
OLLAMA_TYPES = ("ollama", "ollama-external")
LEASE = "service-sync"
T = TypeVar("T")


Run = Callable[[Callable[[Session], T]], Awaitable[T]]  # one transaction in a worker thread (Database.in_session)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """What an admin call is made to: read from a service's row in one transaction, called with
    no transaction open (a slow backend must hold no database lock, and SQLite has one for
    everybody), and compared again in the transaction that writes what the backend answered."""

    type: str
    url: str
    credential: str | None = field(repr=False)  # sealed, as stored

    @classmethod
    def of(cls, service: Service) -> Endpoint:
        return cls(service.type, service.url, service.credential)


class ServiceChanged(Conflict):
    """The service's URL or key changed while its backend was being read: what it answered is
    about a backend the service no longer points at, so nothing is written (try again)."""


CHANGED = "was changed while its backend was being read; nothing was written: try again"


def checked(session: Session, service: Service, endpoint: Endpoint, changed: str = CHANGED) -> Service:
    """``service``, held for this transaction as it was when ``endpoint`` was read from it: a
    guarded UPDATE takes the row (PostgreSQL's row lock, SQLite's write lock) only where it still
    points there, so no change committed since, nor one committed before this transaction ends,
    slips in between the check and the write. ServiceChanged (``changed`` says why) otherwise."""
    credential = (Service.credential.is_(None) if endpoint.credential is None
                  else Service.credential == endpoint.credential)
    guard = (update(Service).where(Service.id == service.id, Service.type == endpoint.type,
                                   Service.url == endpoint.url, credential)
             .values(url=Service.url).execution_options(synchronize_session=False))
    if session.execute(guard).rowcount != 1:  # type: ignore[attr-defined]
        raise ServiceChanged(f"service '{service.name}' {changed}")
    if Endpoint.of(service) != endpoint:  # read before the guard, in this transaction: as stale
        session.refresh(service)
    return service


def backend_for(endpoint: Endpoint, settings: Settings, admin: AdminClient | None = None) -> Backend:
    credential = CredentialBox.from_settings(settings).open(endpoint.credential)
    return make_backend(endpoint.type, endpoint.url, credential, settings, admin=admin)


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


@dataclass(frozen=True, slots=True)
class Reading:
    """What a backend said of itself. ``models`` None: it could not be read (``error`` says why);
    ``version_read``: its version was read (``version``, None when it gave none it could read)."""

    version: str | None
    version_read: bool
    models: list[RemoteModel] | None
    error: str | None  # the service's last_error: why the read failed, or what of it did
    at: dt.datetime


async def read(endpoint: Endpoint, settings: Settings, admin: AdminClient | None) -> Reading:
    """Read the version and the models; raises BackendError (the caller decides what that means).
    A version the backend answers but that cannot be read (a 404, not JSON) is no version: the
    gate closes (SPEC §4), the models are still read, and ``error`` says why."""
    reading = await try_read(endpoint, settings, admin)
    if reading.models is None:
        raise BackendError(reading.error or "the backend could not be read")
    return reading


async def try_read(endpoint: Endpoint, settings: Settings, admin: AdminClient | None) -> Reading:
    """As ``read``, with a backend that cannot be read answered as a Reading without models."""
    version: str | None = None
    version_read = False
    try:
        backend = backend_for(endpoint, settings, admin)
        problem = None
        try:
            version, version_read = await backend.read_version(), True
        except BackendAuthRejected:
            raise
        except BackendProtocolError as exc:
            version_read, problem = True, f"cannot read the version: {exc}"
        models = await backend.list_models()
    except (CredentialUnavailable, BackendAuthRejected) as exc:  # a key this node cannot open, or one refused
        return Reading(version, version_read, None, str(exc), utcnow())
    except BackendError as exc:  # the backend's failure: one message for all (a local file's says what it is)
        error = str(exc) if endpoint.type == "local" else not_a_backend(endpoint, exc)
        return Reading(version, version_read, None, error, utcnow())
    return Reading(version, version_read, models, problem, utcnow())


DEFAULT_PORTS = {"http": 80, "https": 443}


def origin(url: str) -> str:
    """``url``'s scheme, host and port, normalised (lowercase, the default port filled in): where
    a service's stored key is sent. ``http://GPU:80/v1`` and ``http://gpu`` have one origin."""
    parts = urlsplit(url)
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    host = f"[{host}]" if ":" in host else host  # an IPv6 literal
    return f"{scheme}://{host}:{parts.port or DEFAULT_PORTS.get(scheme, '')}"


def not_a_backend(endpoint: Endpoint, exc: BackendError) -> str:
    """What an admin is told when ``endpoint`` could not be read: one message for every way a
    backend fails to be one (refused, timed out, a TLS error, a redirect, a 404, an answer that
    is not the protocol's), so adding services maps no ports for an operator (which answered,
    which redirected, which is closed). The precise reason goes to the server log."""
    try:
        where = origin(endpoint.url)
    except ValueError:
        where = shown_url(endpoint.url)
    log.warning("could not read %s backend at %s: %s", endpoint.type, shown_url(endpoint.url), exc)
    article = "an" if endpoint.type[:1] in "aeiou" else "a"
    return (f"could not read {endpoint.type} backend at {where}: it did not answer as {article} {endpoint.type} "
            "server (see the server log)")


def record(session: Session, service: Service, reading: Reading, actor: Actor | None = None) -> Service:
    """Write what a read of ``service`` found: its status, and its model rows (``register``).
    With an ``actor`` (an admin pressed Refresh) the refresh and its outcome are audited."""
    before = _names(session, service) if service.id is not None else []
    if reading.version_read:
        service.version = reading.version
    if reading.models is None:
        service.reachable = False
        service.last_error = reading.error
    else:
        service.reachable = True
        service.last_error = reading.error
        service.last_sync_at = reading.at
        register(session, service, reading.models)
    if actor is not None:
        session.flush()
        after = _names(session, service)
        audit.record(session, actor=actor.name, action="service.refresh", target=f"service:{service.name}",
                     request_id=actor.request_id,
                     details={"version": service.version, "reachable": service.reachable,
                              "added": sorted(set(after) - set(before)),
                              "removed": sorted(set(before) - set(after))})
    return service


async def refresh(run: Run[Any], settings: Settings, admin: AdminClient | None, find: Callable[[Session], Service],
                  actor: Actor | None = None, *, then: Callable[[Session, Service], T]) -> T:
    """Re-read the service ``find`` finds: its row read in one transaction, its backend read with
    none open, what it answered written in a second one (ServiceChanged when the service's URL
    or key changed in between). A backend that cannot be read is written as unreachable, not
    raised. ``then`` makes the answer in the writing transaction (an API's view of the service)."""
    endpoint = await run(lambda s: Endpoint.of(find(s)))
    reading = await try_read(endpoint, settings, admin)
    return await run(lambda s: then(s, record(s, checked(s, find(s), endpoint), reading, actor)))


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
    """Reads every service at start-up and then on a schedule (versions and models). Its calls are
    awaited on the gateway's loop with no transaction open: stopping is cancelling its task, which
    gives up a backend call under way at once (nothing is written for that service). A transaction
    already in its worker thread cannot be given up: it ends on its own, and ``settled`` waits for
    it before the database closes."""

    def __init__(self, database: Database, settings: Settings, on_change: Callable[[], Any],
                 admin: AdminClient | None = None) -> None:
        self._database = database
        self._settings = settings
        self._on_change = on_change
        self._admin = admin
        self.runs = 0  # syncs this process ran (the lease makes other replicas skip theirs)
        self._transactions: set[asyncio.Future[Any]] = set()

    async def _in_session(self, work: Callable[[Session], T]) -> T:
        """``Database.in_session``, kept track of: a cancel reaches this task, not the thread."""
        transaction = asyncio.ensure_future(self._database.in_session(work))
        self._transactions.add(transaction)
        transaction.add_done_callback(_settle)
        transaction.add_done_callback(self._transactions.discard)
        return await asyncio.shield(transaction)

    async def settled(self, timeout: float) -> None:
        """Until the transactions under way have ended (at most ``timeout`` seconds)."""
        if self._transactions:
            await asyncio.wait(set(self._transactions), timeout=timeout)

    async def sync_all(self) -> None:
        ids = await self._in_session(lambda s: list(s.scalars(select(Service.id))))
        for service_id in ids:
            try:
                await refresh(self._in_session, self._settings, self._admin,
                              functools.partial(_by_id, service_id=service_id), then=itself)
            except (NotFound, ServiceChanged):
                continue  # removed, or changed (and read) by an admin meanwhile
            except Exception:  # one broken service must not stop the others' sync
                log.exception("scheduled sync of service %s failed", service_id)

    async def run(self, interval: float) -> None:
        """Sync at start-up, whoever holds the ``service-sync`` lease (SPEC §4: the version is read
        when Arbiter starts; a read is safe to repeat, and the holder may be a process that was
        killed and keeps the lease until it runs out), then on one replica at a time: the holder."""
        started = False
        while True:
            try:
                held = await asyncio.to_thread(lease.try_hold, self._database, LEASE, max(interval * 2.5, 30.0))
                if held or not started:
                    await self.sync_all()
                    started = True
                    self.runs += 1
                    await self._on_change()
            except Exception:  # the database may be away: try again next time
                log.exception("scheduled sync failed")
            await asyncio.sleep(interval)

    def release(self) -> None:
        lease.release(self._database, LEASE)


def _settle(transaction: asyncio.Future[Any]) -> None:
    if not transaction.cancelled():
        transaction.exception()  # retrieved: the sync's task reports it, or was cancelled and need not


def itself(_session: Session, service: Service) -> Service:
    """The ``then`` of a caller that wants the service itself."""
    return service


def _by_id(session: Session, service_id: int) -> Service:
    service = session.get(Service, service_id)
    if service is None:
        raise NotFound(f"service {service_id} does not exist")
    return service
