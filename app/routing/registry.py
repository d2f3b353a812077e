"""The model registry: public name -> the replicas that serve it. Built in one place,
held in memory (no database on the hot path), reloaded from the database on a
schedule and at once after an admin change in this process.

It imports no admin code: what it reads (``rows.ReadRows``) and how a replica's metric labels are
made (``ReplicaLabels``) are handed to it by ``app/components.py``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from app.db.session import Database
from app.errors import ArbiterError, InvalidRequest, NotFound, Unsupported
from app.routing.backends import PROVIDER_NAMES, calibrates, embedder, label_reader, make_backend
from app.routing.credentials import CredentialBox, CredentialUnavailable
from app.routing.rejections import RejectedCredentials
from app.routing.rows import ModelRow, ReadRows, RegistryRows
from app.routing.strategies.embedding_backend import EmbeddingBackend
from app.routing.strategies.label_backend import LabelBackend
from app.settings import Settings
from infra_adapters.base import Backend

log = logging.getLogger("arbiter.registry")
Labels = tuple[str, str, str]
# A replica's (answered_by, tried_at) from its backend's URL and its model's name on the backend
# (app/telemetry/metrics.py's backend_labels).
ReplicaLabels = Callable[[str, str], tuple[Labels, Labels]]


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
    # The duration histogram's server_address, server_port and gen_ai_response_model for a
    # request this replica answered, and for one it failed (app/telemetry/metrics.py), made once
    # by whoever builds the replica (``Registry.replica_labels``) instead of per request (the
    # backend, hence its URL, is fixed for a replica's life).
    answered_by: Labels
    tried_at: Labels
    in_flight: int = 0
    legacy: bool = False  # on a mesh node whose version does not know decision models

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
    def __init__(self, database: Database, settings: Settings, read: ReadRows,
                 labels: ReplicaLabels) -> None:
        self._database = database
        self._settings = settings
        self._read_rows = read
        self.replica_labels = labels  # the mesh's replicas get theirs here too
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
        says so (written off the request path; see app/routing/rejections.py)."""
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
            rows = await asyncio.to_thread(self._read)
            self._apply(rows.models)
            self._aliases = rows.aliases
            self._reachable = rows.reachable

    def _read(self) -> RegistryRows:
        with self._database.session() as session:
            return self._read_rows(session)

    def _apply(self, rows: list[ModelRow]) -> None:
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
                                  frozenset(caps), text_limit, timeout, created,
                                  *self.replica_labels(backend.url, backend_name))
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
