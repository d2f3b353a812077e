"""Request bodies of the admin API. Unknown fields are refused (400), and so is text with a
control character or a lone surrogate in any string field (``SafeStr``), before anything is
written."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Discriminator, Field, Tag
from pydantic_core import PydanticCustomError

from app.text import text_problem


def _safe(value: str) -> str:
    problem = text_problem(value)
    if problem is not None:  # the value is not echoed: it may not even be encodable
        raise PydanticCustomError("unsafe_text", problem)
    return value


SafeStr = Annotated[str, AfterValidator(_safe)]


def _allowlist_kind(value: object) -> str:
    return "all" if isinstance(value, str) else "list"


# "all" or a list of public model names; an error names the form the value took.
Allowlist = Annotated[Annotated[Literal["all"], Tag("all")] | Annotated[list[SafeStr], Tag("list")],
                      Discriminator(_allowlist_kind)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OrganizationCreate(_Strict):
    name: SafeStr = Field(min_length=1, max_length=200)


class OrganizationRename(_Strict):
    name: SafeStr = Field(min_length=1, max_length=200)


class ProjectCreate(_Strict):
    name: SafeStr = Field(min_length=1, max_length=200)
    models: Allowlist = "all"
    organization: SafeStr | None = Field(None, max_length=200)


class ProjectUpdate(_Strict):
    models: Allowlist | None = None
    archived: bool | None = None
    requests_per_minute: int | None = Field(None, ge=1, le=10**12)
    tokens_per_minute: int | None = Field(None, ge=1, le=10**12)


class KeyUpdate(_Strict):
    requests_per_minute: int | None = Field(None, ge=1, le=10**12)
    tokens_per_minute: int | None = Field(None, ge=1, le=10**12)


class KeyCreate(_Strict):
    name: SafeStr = Field("", max_length=200)
    expires_at: dt.datetime | None = None


class AdminKeyCreate(KeyCreate):
    # owner, operator, viewer or project-admin (app/tenancy/roles.py); omitted: owner.
    role: Literal["owner", "operator", "viewer", "project-admin"] | None = None
    # project-admin only (and required there): the names of the projects it manages.
    projects: list[SafeStr] | None = Field(None, max_length=1000)


class KeyRotate(_Strict):
    grace_seconds: int = Field(3600, ge=0, le=30 * 86400)


class ServiceCreate(_Strict):
    type: SafeStr = Field(max_length=100)
    url: SafeStr | None = Field(None, min_length=1, max_length=2000)
    name: SafeStr | None = Field(None, min_length=1, max_length=200)
    api_key: str | None = Field(None, min_length=1, max_length=4096)
    text_limit: int | None = Field(None, gt=0)
    timeout: float | None = Field(None, gt=0, le=3600)
    context_length: int | None = Field(None, ge=256, le=1 << 21)
    # Add it even though it serves decision models and a known mesh peer is too old for them (as
    # when installing one); without it, that answers 409 mesh_warning and nothing is added.
    confirm: bool = False


class ServiceUpdate(_Strict):
    url: SafeStr | None = Field(None, min_length=1, max_length=2000)
    api_key: str | None = Field(None, min_length=1, max_length=4096)
    text_limit: int | None = Field(None, gt=0)
    timeout: float | None = Field(None, gt=0, le=3600)
    context_length: int | None = Field(None, ge=256, le=1 << 21)
    version_override: SafeStr | None = Field(None, min_length=1, max_length=100)


class ModelInstallRequest(_Strict):
    model: SafeStr = Field(min_length=1, max_length=200)
    capabilities: list[SafeStr] | None = None
    public_name: SafeStr | None = Field(None, min_length=1, max_length=200)
    # Install even though a known mesh peer is too old for decision models (it then refuses
    # this node's model list); without it, such an install answers 409 mesh_warning.
    confirm: bool = False


class ModelUpdate(_Strict):
    public_name: SafeStr | None = Field(None, min_length=1, max_length=200)
    timeout: float | None = Field(None, gt=0, le=3600)
    # "labels": answer decisions by reading label-token logprobs; "embeddings": by embedding
    # similarity (an embedding model); null: the model's own way.
    read_strategy: Literal["labels", "embeddings"] | None = None
    # The embeddings strategy's softmax temperature; null: the calibrated default (docs/labels.md).
    embedding_temperature: float | None = Field(None, gt=0, le=10)
    # Turn label reading on even though a known mesh peer is too old for decision models (as
    # when installing one); without it, that answers 409 mesh_warning.
    confirm: bool = False


class MeshPeerCreate(_Strict):
    url: SafeStr = Field(min_length=8, max_length=500)


class AliasCreate(_Strict):
    alias: SafeStr = Field(min_length=1, max_length=200)
    model: SafeStr = Field(min_length=1, max_length=200)
