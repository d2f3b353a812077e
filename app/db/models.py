"""The tables. The one place that knows them; domain packages import from here."""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSON, list[Any]: JSON}


class Organization(Base):
    __tablename__ = "organizations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Project(Base):
    __tablename__ = "projects"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    organization_id: Mapped[int] = mapped_column(ForeignKey("organizations.id"))
    name: Mapped[str] = mapped_column(String(200), unique=True)
    # None means every model ("all"); otherwise a list of public model names.
    allowed_models: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    archived: Mapped[bool] = mapped_column(Boolean, default=False)
    requests_per_minute: Mapped[int | None] = mapped_column(Integer, nullable=True)
    tokens_per_minute: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))  # "project" or "admin"
    project_id: Mapped[int | None] = mapped_column(ForeignKey("projects.id"), nullable=True)
    name: Mapped[str] = mapped_column(String(200), default="")
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(32))
    last_four: Mapped[str] = mapped_column(String(4))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    expires_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    revoked_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    last_used_at: Mapped[dt.datetime | None] = mapped_column(
        DateTime(timezone=True), nullable=True
    )
    replaced_by_id: Mapped[int | None] = mapped_column(ForeignKey("api_keys.id"), nullable=True)
    requests_per_minute: Mapped[int | None] = mapped_column(Integer, nullable=True)
    tokens_per_minute: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # Admin keys only: owner, operator, viewer or project-admin (NULL reads as owner); the ids of
    # the projects a project-admin key may manage.
    role: Mapped[str | None] = mapped_column(String(16), nullable=True)
    admin_projects: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)


class Service(Base):
    __tablename__ = "services"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    type: Mapped[str] = mapped_column(String(32))
    url: Mapped[str] = mapped_column(String(2000))
    credential: Mapped[str | None] = mapped_column(Text, nullable=True)
    text_limit: Mapped[int] = mapped_column(Integer)
    timeout: Mapped[float | None] = mapped_column(Float, nullable=True)
    context_length: Mapped[int | None] = mapped_column(Integer, nullable=True)
    version: Mapped[str | None] = mapped_column(String(100), nullable=True)
    version_override: Mapped[str | None] = mapped_column(String(100), nullable=True)
    reachable: Mapped[bool] = mapped_column(Boolean, default=False)
    last_sync_at: Mapped[dt.datetime | None] = mapped_column(
        DateTime(timezone=True), nullable=True
    )
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    skipped_models: Mapped[list[Any]] = mapped_column(JSON, default=list)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Model(Base):
    __tablename__ = "models"
    __table_args__ = (UniqueConstraint("service_id", "backend_name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    service_id: Mapped[int] = mapped_column(ForeignKey("services.id", ondelete="CASCADE"))
    public_name: Mapped[str] = mapped_column(String(200), index=True)
    backend_name: Mapped[str] = mapped_column(String(200))
    capabilities: Mapped[list[Any]] = mapped_column(JSON, default=list)
    source: Mapped[str] = mapped_column(String(16), default="sync")  # sync, catalog, custom
    timeout: Mapped[float | None] = mapped_column(Float, nullable=True)
    # "labels": answer decisions by reading label-token logprobs (app/routing/strategies/labels.py);
    # "embeddings": by embedding similarity (app/routing/strategies/embeddings.py).
    read_strategy: Mapped[str | None] = mapped_column(String(20), nullable=True)
    # The softmax temperature of the "embeddings" read strategy (null: the default of
    # app/routing/strategies/embeddings.py).
    embedding_temperature: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ModelAlias(Base):
    """A second public name for a model (SPEC §1, model aliases): ``name`` stands for the model
    whose public name is ``target``. Resolved in memory by the registry, never on the hot path."""

    __tablename__ = "model_aliases"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    target: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ModelInstall(Base):
    """A model being pulled onto an Ollama: progress any replica can read, a cancel any can ask."""

    __tablename__ = "model_installs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    service_id: Mapped[int] = mapped_column(ForeignKey("services.id", ondelete="CASCADE"))
    backend_name: Mapped[str] = mapped_column(String(200))
    public_name: Mapped[str] = mapped_column(String(200))
    capabilities: Mapped[list[Any]] = mapped_column(JSON, default=list)
    source: Mapped[str] = mapped_column(String(16), default="catalog")
    status: Mapped[str] = mapped_column(String(16), default="running")  # running, succeeded, failed, cancelled
    stage: Mapped[str] = mapped_column(String(200), default="starting")
    percent: Mapped[float] = mapped_column(Float, default=0.0)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    actor: Mapped[str] = mapped_column(String(200), default="")
    started_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class UsageRecord(Base):
    """One decision (or chat) request as billed: written in batches, never updated.

    The table is ``usage_ledger`` from 0018: on PostgreSQL partitioned by UTC day on ``at``, its
    primary key (id, at) there (a partitioned table's keys hold its partition key), and old days
    dropped whole (app/telemetry/retention.py). Rows the previous release wrote into
    ``usage_records`` are moved here by that job, keeping their ids (one sequence for both)."""

    __tablename__ = "usage_ledger"
    __table_args__ = (Index("ix_usage_ledger_project_at", "project_id", "at"), Index("ix_usage_ledger_at", "at"),
                      # With ``at``: a unique index of a partitioned table holds the partition key. A
                      # record's ``at`` is fixed when it is made, so a replayed batch still adds nothing.
                      Index("ux_usage_ledger_record_uid", "record_uid", "at", unique=True),
                      # The web UI finds a request by the X-Request-Id its caller got (0013).
                      Index("ix_usage_ledger_request_id", "request_id"))

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    request_id: Mapped[str] = mapped_column(String(64))
    project_id: Mapped[int | None] = mapped_column(ForeignKey("projects.id", ondelete="SET NULL"), nullable=True)
    key_id: Mapped[int | None] = mapped_column(ForeignKey("api_keys.id", ondelete="SET NULL"), nullable=True)
    operation: Mapped[str] = mapped_column(String(32))  # decision, chat
    model: Mapped[str] = mapped_column(String(200))  # the public name
    provider: Mapped[str | None] = mapped_column(String(32), nullable=True)
    status: Mapped[int] = mapped_column(Integer)
    input_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    output_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    latency_ms: Mapped[float] = mapped_column(Float)
    # Made by the ledger when it writes the row: a retried batch whose first COMMIT did land (its
    # answer lost on the way back) inserts nothing twice. NULL on rows from before 0008.
    record_uid: Mapped[str | None] = mapped_column(String(32), nullable=True)
    # The alias the caller named, when it named one (``model`` is then its target). From 0011.
    alias: Mapped[str | None] = mapped_column(String(200), nullable=True)


class UsageRollup(Base):
    """The ledger's totals per UTC hour and per everything a report groups or filters by, kept in
    the transaction that writes the records (app/db/rollups.py): reports read these, never the
    raw rows. A missing project, key, alias or provider is 0 or '' (a key column cannot be NULL);
    no foreign keys, so the totals outlive what they count (as the records' ids do)."""

    __tablename__ = "usage_rollups"
    __table_args__ = (Index("ix_usage_rollups_project_hour", "project_id", "hour"),)

    hour: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    project_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    alias: Mapped[str] = mapped_column(String(200), primary_key=True)
    operation: Mapped[str] = mapped_column(String(32), primary_key=True)
    provider: Mapped[str] = mapped_column(String(32), primary_key=True)
    status: Mapped[int] = mapped_column(Integer, primary_key=True)
    requests: Mapped[int] = mapped_column(BigInteger)
    input_tokens: Mapped[int] = mapped_column(BigInteger)
    output_tokens: Mapped[int] = mapped_column(BigInteger)
    latency_ms: Mapped[float] = mapped_column(Float)  # the sum: the mean is latency_ms / requests


class UsageLatencyRollup(Base):
    """The latency histogram per UTC hour and project (app/db/rollups.py's ``LATENCY_EDGES``):
    each bin's count, lowest and highest value, so percentiles read from it are those the raw
    rows give."""

    __tablename__ = "usage_latency_rollups"
    __table_args__ = (Index("ix_usage_latency_rollups_project_hour", "project_id", "hour"),)

    hour: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    project_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    bin: Mapped[int] = mapped_column(Integer, primary_key=True)
    requests: Mapped[int] = mapped_column(BigInteger)
    low: Mapped[float] = mapped_column(Float)
    high: Mapped[float] = mapped_column(Float)


class Lease(Base):
    """Who runs a background job (service syncs) among the replicas, until when."""

    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    holder: Mapped[str] = mapped_column(String(200))
    expires_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))


class AuditEntry(Base):
    """Append-only: rows are inserted, never deleted, and never updated but for ``count``, which
    only grows: a refusal repeated within a minute (app/audit.py ``fold``) adds one to the row
    the first one wrote, found by its ``fold_key`` (on PostgreSQL a trigger holds this, 0014)."""

    __tablename__ = "audit_log"
    __table_args__ = (Index("ux_audit_log_fold_key", "fold_key", unique=True),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    actor: Mapped[str] = mapped_column(String(200))
    action: Mapped[str] = mapped_column(String(100))
    target: Mapped[str] = mapped_column(String(400))
    request_id: Mapped[str | None] = mapped_column(String(64), nullable=True)  # Arbiter's own id
    details: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # The X-Request-Id the caller sent, if any: kept beside Arbiter's id, never instead of it.
    client_request_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # How many times this happened: 1, or the refusals of one key, action and target in one minute.
    count: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    # Folded entries only: a digest of (actor, action, target, minute), unique; NULL for the rest.
    fold_key: Mapped[str | None] = mapped_column(String(64), nullable=True)


class UiSessionRow(Base):
    """A web UI session, so every replica can end it (sign-out, idle, the key revoked or
    rotated). Keyed by a digest of the cookie: the table never holds a usable session id."""

    __tablename__ = "ui_sessions"

    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    key_id: Mapped[int] = mapped_column(ForeignKey("api_keys.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_seen_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    expires_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), index=True)
    ended_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class MeshPeer(Base):
    """A peer added through the admin API (peers from ARBITER_MESH_PEERS are not stored)."""

    __tablename__ = "mesh_peers"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    url: Mapped[str] = mapped_column(String(500), unique=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class MeshNonce(Base):
    """A nonce of a signed mesh request this node accepted, kept until its signature can no
    longer be used (so a replay is refused by every replica of the node, and after a restart)."""

    __tablename__ = "mesh_nonces"

    nonce: Mapped[str] = mapped_column(String(32), primary_key=True)
    expires_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), index=True)


class DeploymentSecret(Base):
    """A random secret this deployment made for itself, once, where no setting gives one (the
    cache salt's without ARBITER_SECRET_KEY or ARBITER_KEY_PEPPER): every replica reads the same."""

    __tablename__ = "deployment_secrets"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(200))
