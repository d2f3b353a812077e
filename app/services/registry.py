"""The model registry: public name -> the replicas that serve it. Built in one place,
held in memory (no database on the hot path), reloaded from the database on a
schedule and at once after an admin change in this process."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.models import Service
from app.db.session import Database
from app.decisions.embedding_backend import EmbeddingBackend
from app.decisions.label_backend import LabelBackend
from app.errors import ArbiterError, InvalidRequest, NotFound, Unsupported
from app.services import aliases as alias_rows
from app.services import service as services
from app.services import sync
from app.services.backends import PROVIDER_NAMES, calibrates, embedder, label_reader, make_backend
from app.services.credentials import CredentialBox, CredentialUnavailable
from app.services.rejections import RejectedCredentials
from app.settings import Settings
from app.telemetry.metrics import backend_labels
from infra_adapters.base import Backend

log = logging.getLogger("arbiter.registry")


@dataclass(eq=False, slots=True)
class Replica:
    """One service's copy of a public model. ``in_flight`` is this process's count."""

    service_id: int
    service_name: str
    service_type: str
    backend: Backend
    backend_name: str
    capabilities: frozenset[str]
    text_limit: int
    timeout: float
    created: int
    in_flight: int = 0
    legacy: bool = False  # on a mesh node whose version does not know decision models
    # The duration histogram's server_address, server_port and gen_ai_response_model for a
    # request this replica answered, and for one it failed (app/telemetry/metrics.py), made once
    # here instead of per request (the backend, hence its URL, is fixed for a replica's life).
    answered_by: tuple[str, str, str] = field(init=False)
    tried_at: tuple[str, str, str] = field(init=False)

    def __post_init__(self) -> None:
        self.answered_by, self.tried_at = backend_labels(self.backend.url, self.backend_name)

    @property
    def provider(self) -> str:
        return PROVIDER_NAMES.get(self.service_type, self.service_type)


@dataclass(slots=True)
class ModelEntry:
    public_name: str
    replicas: list[Replica] = field(default_factory=list)

    @property
    def capabilities(self) -> frozenset[str]:
        caps: frozenset[str] = frozenset()
        for replica in self.replicas:
            caps |= replica.capabilities
        return caps


class Registry:
    def __init__(self, database: Database, settings: Settings) -> None:
        self._database = database
        self._settings = settings
        self._models: dict[str, ModelEntry] = {}
        # Models other mesh nodes have (set by the mesh), and models only on nodes this node cannot
        # use, with the error a request for them gets, per operation ("decision" or "chat").
        self._remote: dict[str, ModelEntry] = {}
        self._blocked: dict[str, dict[str, ArbiterError]] = {}
        # Decision models of this node's services whose Ollama is too old for them (version gating):
        # kept apart, so a request for one gets why (405) instead of "not installed".
        self._gated: dict[str, dict[str, ArbiterError]] = {}
        # Alias -> its target's public name (app/services/aliases.py), read with the models.
        self._aliases: dict[str, str] = {}
        # Service name -> whether it answered its last read (its status's ``reachable``), read with
        # the models: the gauge arbiter_service_up (app/telemetry/service_up.py).
        self._reachable: dict[str, bool] = {}
        self.max_hops = settings.mesh_max_hops
        self._backends: dict[int, tuple[tuple[str, str, str | None, bool], Backend]] = {}
        self._label_backends: dict[tuple[int, str], LabelBackend | EmbeddingBackend] = {}
        self._lock = asyncio.Lock()
        self._box = CredentialBox.from_settings(settings)
        self._rejections = RejectedCredentials(database)

    def get(self, public_name: str) -> ModelEntry | None:
        """The model on this node, else on the mesh."""
        return self._models.get(public_name) or self._remote.get(public_name)

    def known(self, public_name: str) -> bool:
        """True for a model this node or the mesh has, usable or not (a name an admin chose)."""
        return self.get(public_name) is not None or public_name in self._gated

    def resolve(self, name: str) -> str:
        """The public name a request for ``name`` is for: an alias's target, else ``name`` itself.
        A model of that name (here, on the mesh, or gated) wins over an alias. One dict look-up
        when ``name`` is no alias: this is on the hot path."""
        target = self._aliases.get(name)
        if target is None or self.known(name):
            return name
        return target

    def alias_target(self, name: str) -> str | None:
        """The target of ``name`` when a request for it goes through an alias, else None."""
        target = self.resolve(name)
        return None if target == name else target

    def aliases(self) -> dict[str, str]:
        """Alias -> target, as last read from the database (shadowed ones included)."""
        return dict(self._aliases)

    def reachable_services(self) -> dict[str, bool]:
        """Every registered service, by name: whether it answered its last read, as last reloaded."""
        return self._reachable

    def find(self, public_name: str, hops: int = 0, operation: str = "decision") -> ModelEntry:
        """Where a request that has taken ``hops`` mesh hops so far goes: this node's replicas
        first, else the mesh's while the hop limit allows; NotFound (or why not) otherwise."""
        entry = self._models.get(public_name)
        if entry is not None:
            return entry
        remote = self._remote.get(public_name)
        if remote is not None and hops < self.max_hops:
            return remote
        gated = self._gated.get(public_name)
        if gated is not None:
            raise gated[operation]
        blocked = self._blocked.get(public_name)
        if blocked is not None and hops < self.max_hops:
            raise blocked[operation]
        raise NotFound(f"model '{public_name}' is not installed")

    def note_credential_rejected(self, replica: Replica) -> None:
        """A backend refused Arbiter's own credential on a forwarded request: its service's status
        says so (written off the request path; see app/services/rejections.py)."""
        self._rejections.note(replica.service_id, replica.backend.url)

    def set_remote(self, entries: dict[str, ModelEntry], blocked: dict[str, dict[str, ArbiterError]]) -> None:
        """The mesh's view changed."""
        self._remote = entries
        self._blocked = blocked

    def reachable(self) -> list[ModelEntry]:
        """This node's models and the mesh's, by name (a tenant's list of models)."""
        merged = {**self._remote, **self._models}
        return [merged[name] for name in sorted(merged)]

    def names(self) -> list[str]:
        return sorted(self._models)

    def entries(self) -> list[ModelEntry]:
        return [self._models[name] for name in sorted(self._models)]

    async def reload(self) -> None:
        async with self._lock:
            rows, aliases, reachable = await asyncio.to_thread(self._read)
            self._apply(rows)
            self._aliases = aliases
            self._reachable = reachable

    def _read(self) -> tuple[list[tuple[Any, ...]], dict[str, str], dict[str, bool]]:
        with self._database.session() as session:
            reachable = {name: bool(up) for name, up in session.execute(select(Service.name, Service.reachable))}
            return self._rows(session), alias_rows.all_targets(session), reachable

    @staticmethod
    def _rows(session: Session) -> list[tuple[Any, ...]]:
        return [
            (s.id, s.name, s.type, s.url, s.credential, s.text_limit, s.timeout,
             m.public_name, m.backend_name, list(m.capabilities), m.timeout,
             int(m.created_at.timestamp()) if m.created_at else 0, services.read_strategy_of(m, s),
             sync.gate_of(m, s), sync.salts_prefix_cache(s), m.embedding_temperature)
            for m, s in services.all_models(session)
        ]

    def _apply(self, rows: list[tuple[Any, ...]]) -> None:
        models: dict[str, ModelEntry] = {}
        gated: dict[str, dict[str, ArbiterError]] = {}
        old_replicas = {(r.service_id, r.backend_name): r for e in self._models.values() for r in e.replicas}
        live_services: set[int] = set()
        live_labels: set[tuple[int, str]] = set()
        for (service_id, service_name, service_type, url, credential, text_limit, service_timeout,
             public, backend_name, caps, model_timeout, created, strategy, gate, salts, temperature) in rows:
            if gate is not None:
                gated.setdefault(public, _gated_errors(public, service_name, gate))
                continue
            try:
                credential = self._box.open(credential)
            except CredentialUnavailable as exc:
                log.error("service %s is left out: %s", service_name, exc)
                continue
            live_services.add(service_id)
            backend = self._backend(service_id, service_type, url, credential, salts)
            if strategy == "labels":  # a generation model answering decisions by label reading
                backend = self._labelled(service_id, service_type, backend_name, backend, credential)
                live_labels.add((service_id, backend_name))
                caps = sorted({*caps, "decision"})
            elif strategy == "embeddings":  # an embedding model answering decisions by similarity
                backend = self._embedded(service_id, service_type, backend_name, backend, credential, temperature)
                live_labels.add((service_id, backend_name))
                caps = sorted({*caps, "decision"})
            timeout = model_timeout or service_timeout or self._settings.backend_timeout
            replica = old_replicas.get((service_id, backend_name))
            if replica is not None and replica.backend is backend:
                # The same object, updated in place: requests in flight decrement the counter
                # they incremented, so least-in-flight stays true across reloads.
                replica.service_name, replica.service_type = service_name, service_type
                replica.capabilities, replica.text_limit = frozenset(caps), text_limit
                replica.timeout, replica.created = timeout, created
            else:
                replica = Replica(service_id, service_name, service_type, backend, backend_name,
                                  frozenset(caps), text_limit, timeout, created)
            models.setdefault(public, ModelEntry(public)).replicas.append(replica)
        self._models = models
        self._gated = {name: errors for name, errors in gated.items() if name not in models}
        for key in [k for k in self._label_backends if k not in live_labels]:
            asyncio.get_running_loop().create_task(self._label_backends.pop(key).aclose())
        for service_id in list(self._backends):
            if service_id not in live_services:
                _, backend = self._backends.pop(service_id)
                asyncio.get_running_loop().create_task(backend.aclose())

    def _labelled(self, service_id: int, service_type: str, backend_name: str, inner: Backend,
                  credential: str | None) -> Backend:
        """The model's label-reading backend over the service's, kept while the service's is."""
        known = self._label_backends.get((service_id, backend_name))
        if isinstance(known, LabelBackend) and known.inner is inner:
            return known
        if known is not None:
            asyncio.get_running_loop().create_task(known.aclose())
        labelled = LabelBackend(inner, backend_name, label_reader(service_type, inner, backend_name, credential,
                                                                  self._settings),
                                self._settings.label_mass_warning,
                                calibrates(self._settings.label_calibration, service_type))
        self._label_backends[(service_id, backend_name)] = labelled
        return labelled

    def _embedded(self, service_id: int, service_type: str, backend_name: str, inner: Backend,
                  credential: str | None, temperature: float | None) -> Backend:
        """The model's similarity backend over the service's, kept (with its passage cache) while
        the service's is; the model's temperature is set at every reload."""
        known = self._label_backends.get((service_id, backend_name))
        if isinstance(known, EmbeddingBackend) and known.inner is inner:
            known.temperature = temperature or EmbeddingBackend.default_temperature
            return known
        if known is not None:
            asyncio.get_running_loop().create_task(known.aclose())
        embedding = EmbeddingBackend(inner, backend_name, embedder(service_type, inner, backend_name, credential,
                                                                   self._settings), temperature)
        self._label_backends[(service_id, backend_name)] = embedding
        return embedding

    def _backend(self, service_id: int, service_type: str, url: str, credential: str | None,
                 salts_prefix_cache: bool) -> Backend:
        identity = (service_type, url, credential, salts_prefix_cache)
        known = self._backends.get(service_id)
        if known is not None and known[0] == identity:
            return known[1]
        backend = make_backend(service_type, url, credential, self._settings, salts_prefix_cache=salts_prefix_cache)
        if known is not None:
            asyncio.get_running_loop().create_task(known[1].aclose())
        self._backends[service_id] = (identity, backend)
        return backend

    async def run(self, interval: float) -> None:
        """Reload forever (a background task of the app)."""
        while True:
            await asyncio.sleep(interval)
            try:
                await self.reload()
            except Exception:  # the database may be away; keep serving what we have
                log.exception("registry reload failed; serving the last known models")

    async def aclose(self) -> None:
        await self._rejections.aclose()
        for labelled in self._label_backends.values():
            await labelled.aclose()
        self._label_backends.clear()
        for _, backend in self._backends.values():
            await backend.aclose()
        self._backends.clear()


def _gated_errors(public_name: str, service_name: str, gate: str) -> dict[str, ArbiterError]:
    """What a request for a decision model gets while its only Ollama is too old (SPEC §1: 405)."""
    why = f"model '{public_name}' cannot answer decisions: service '{service_name}' is too old. {gate}"
    return {"decision": Unsupported(why), "chat": InvalidRequest(why)}
