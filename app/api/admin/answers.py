"""What the admin API answers, as the OpenAPI document describes it (``answer(Model)``,
app/api/documented.py): one model per view function, field for field (``project_view``,
``key_view``, ``service_view``, ...). Documentation only: the views build the answers, and
tests/api/test_openapi.py checks every real answer against its model, strictly (a field the
model does not name fails there), so the two cannot drift apart unnoticed.

Times are ISO 8601 strings in UTC (``2025-05-01T12:00:00+00:00``); a key that is always there
but may be empty is required and nullable.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, RootModel

Time = Annotated[str, Field(json_schema_extra={"format": "date-time"})]  # ISO 8601, in UTC
Role = Literal["owner", "operator", "viewer", "project-admin"]
# The 409 of a change that would make a decision model while a known mesh peer is too old for them.
SERVICE_CHANGED = ("the service's URL or key changed while its backend was being read (nothing written; try "
                   "again)")
MESH_WARNING = ("mesh_warning: a known mesh peer is too old for decision models (nothing is done; "
                "send \"confirm\": true to go ahead)")


class NewOrganization(BaseModel):
    id: int
    name: str


class Organization(BaseModel):
    id: int
    name: str
    created_at: Time | None
    projects: list[str] = Field(description="its projects' names")


class OrganizationList(BaseModel):
    data: list[Organization]


class Project(BaseModel):
    id: int
    name: str
    models: Literal["all"] | list[str] = Field(description="the allowlist: \"all\" or public model names")
    archived: bool
    requests_per_minute: int | None = Field(description="null: no limit")
    tokens_per_minute: int | None
    created_at: Time | None


class ProjectList(BaseModel):
    data: list[Project]


class OrganizationProjects(BaseModel):
    id: int
    name: str
    created_at: Time | None
    projects: list[Project]


class Key(BaseModel):
    """A key as the admin API shows it: never its value or digest."""

    id: int
    kind: Literal["project", "admin"]
    name: str
    project: str | None = Field(description="a project key's project; null for an admin key")
    prefix: str = Field(description="for display: arb_proj_3fA9")
    last_four: str
    created_at: Time | None
    expires_at: Time | None
    revoked_at: Time | None
    last_used_at: Time | None
    replaced_by: int | None = Field(description="the key a rotation made in its place")
    requests_per_minute: int | None = Field(description="the key's own limit; null: none")
    tokens_per_minute: int | None


class KeyList(BaseModel):
    data: list[Key]


class NewKey(Key):
    key: str = Field(description="the key itself: shown this once, never again")


class AdminKey(Key):
    role: Role
    projects: list[str] = Field(description="a project-admin's projects; [] for the other roles")


class AdminKeyList(BaseModel):
    data: list[AdminKey]


class NewAdminKey(AdminKey):
    key: str = Field(description="the key itself: shown this once, never again")


class AnyKey(RootModel[AdminKey | Key]):
    """A key of either kind: an admin key with its role and projects."""


class BackedOff(BaseModel):
    service_id: int
    model: str = Field(description="the backend's name of the model")
    seconds_left: float


class SkippedModel(BaseModel):
    model: str
    backend_name: str
    reason: str


class Service(BaseModel):
    """A service's status: never its credential (``has_credential`` says whether one is set)."""

    id: int
    name: str
    type: str = Field(description="ollama, ollama-external, ollama-cloud, vllm, openai or local")
    url: str
    has_credential: bool
    text_limit: int = Field(description="bytes of request text its models take")
    timeout: float | None
    context_length: int | None
    version: str | None
    version_override: str | None
    reachable: bool | None
    decisions_supported: bool
    decisions_message: str | None = Field(description="the version gate's message when decisions are not supported")
    last_sync_at: Time | None
    last_error: str | None
    skipped_models: list[SkippedModel]
    prefix_cache_salted: bool | None = Field(description="vllm and openai services: whether prompts get cache_salt")
    prefix_cache_message: str | None


class ServiceStatus(Service):
    backed_off: list[BackedOff] = Field(description="its replicas that sit out a back-off right now")


class ServiceList(BaseModel):
    data: list[ServiceStatus]


class ModelCard(BaseModel):
    id: int
    public_name: str
    backend_name: str
    kind: str = Field(description="decision, completion, embedding or other")
    capabilities: list[str]
    read_strategy: Literal["labels", "embeddings"] | None
    embedding_temperature: float | None
    source: str = Field(description="sync, catalog or custom")
    timeout: float | None
    decisions_message: str | None
    service: str | int = Field(description="the service's name")
    service_type: str | None


class ModelList(BaseModel):
    data: list[ModelCard]


class NewService(ServiceStatus):
    models: list[ModelCard]


class CatalogEntry(BaseModel):
    name: str
    kind: str
    capabilities: list[str]
    services: list[str] = Field(description="the service types it installs on")
    description: str
    size: str


class Catalog(BaseModel):
    data: list[CatalogEntry]


class Install(BaseModel):
    id: int
    service: str | int = Field(description="the service's name (its id once it is gone)")
    model: str
    public_name: str | None
    capabilities: list[str]
    status: Literal["running", "succeeded", "failed", "cancelled"]
    stage: str | None
    percent: float
    error: str | None
    started_at: Time | None
    finished_at: Time | None


class InstallList(BaseModel):
    data: list[Install]


class ReadingWarning(BaseModel):
    code: str
    message: str


class ModelTestResult(BaseModel):
    """The Test action's outcome (docs/admin.md): what is there depends on the model's kind, and
    on whether it worked (``ok``)."""

    kind: str
    model: str
    latency_ms: float
    ok: bool
    status: int | None = Field(description="the backend's status, or Arbiter's error's")
    error: str | None = Field(None, description="when not ok: the backend's error as it came, or Arbiter's")
    source: Literal["arbiter", "backend"] | None = Field(None, description="when not ok: whose error it is")
    question: str | None = Field(None, description="a decision model: the question asked")
    choice: str | None = None
    probabilities: dict[str, float] | None = None
    confidence: float | None = None
    warnings: list[ReadingWarning] | None = Field(None, description="a decision model: the reading's warnings")
    prompt: str | None = Field(None, description="a chat model: what it was asked")
    reply: str | None = None
    dimensions: int | None = Field(None, description="an embedding model: its vector's length")
    head: list[float] | None = Field(None, description="an embedding model: the vector's first numbers")


class Alias(BaseModel):
    alias: str
    model: str = Field(description="the target's public name")
    status: Literal["active", "shadowed", "target_missing"]
    created_at: Time | None


class AliasList(BaseModel):
    data: list[Alias]


class AuditEntry(BaseModel):
    id: int
    at: Time | None
    actor: str = Field(description="admin-key:<id>:<prefix>, cli or environment")
    action: str
    target: str
    request_id: str | None = Field(description="Arbiter's own id of the request")
    client_request_id: str | None = Field(description="the X-Request-Id the caller sent, if any")
    details: dict[str, Any] = Field(description="its texts cut to 512 characters, ending in …(cut) when they were")
    count: int = Field(description="how many times it happened: 1, or the refusals (permission.denied) of one "
                                   "key on one route within a minute, folded into this entry (the first one's "
                                   "request id and details)")


class AuditLog(BaseModel):
    data: list[AuditEntry]


class UsageRow(BaseModel):
    day: str = Field(description="the UTC day, 2025-05-01")
    model: str
    project: str | None
    requests: int
    input_tokens: int
    output_tokens: int
    errors: int = Field(description="answers with a status of 400 or more")
    mean_latency_ms: float


class UsageSummary(BaseModel):
    data: list[UsageRow]
    next: str | None = Field(None, description="the cursor of the next page (pass it as ?cursor=), null on the last")


class RecentRequest(BaseModel):
    at: Time
    request_id: str
    project: str | None
    key_id: int | None
    operation: str
    model: str
    alias: str | None = Field(description="the alias the caller named, when it did")
    provider: str | None
    status: int
    input_tokens: int
    output_tokens: int
    latency_ms: float


class RecentRequests(BaseModel):
    data: list[RecentRequest]


class MeshNode(BaseModel):
    name: str | None
    url: str | None
    version: str
    decision_models: bool


class PeerModel(BaseModel):
    name: str
    type: str
    capabilities: list[str]
    hops: int
    path: list[str]


class MeshPeer(BaseModel):
    id: int | None = Field(description="an added peer's id; null for one from ARBITER_MESH_PEERS or inbound")
    name: str | None
    url: str | None
    direction: Literal["outbound", "inbound"]
    source: Literal["config", "admin", "inbound"]
    state: str
    version: str | None
    decision_models: bool | None
    last_contact: Time | None
    error: str | None
    refused_by_peer: str | None
    models: list[PeerModel]


class RefusedExchange(BaseModel):
    at: Time
    peer: str | None
    address: str | None
    reason: str


class MeshStatus(BaseModel):
    enabled: bool
    node: MeshNode
    peers: list[MeshPeer]
    refused: list[RefusedExchange]


class NewMeshPeer(BaseModel):
    id: int
    url: str
