"""Request bodies of the admin API. Unknown fields are refused (400)."""

from __future__ import annotations

import datetime as dt
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OrganizationCreate(_Strict):
    name: str = Field(min_length=1, max_length=200)


class ProjectCreate(_Strict):
    name: str = Field(min_length=1, max_length=200)
    models: Literal["all"] | list[str] = "all"
    organization: str | None = None


class ProjectUpdate(_Strict):
    models: Literal["all"] | list[str] | None = None
    archived: bool | None = None
    requests_per_minute: int | None = Field(None, ge=1, le=10**12)
    tokens_per_minute: int | None = Field(None, ge=1, le=10**12)


class KeyUpdate(_Strict):
    requests_per_minute: int | None = Field(None, ge=1, le=10**12)
    tokens_per_minute: int | None = Field(None, ge=1, le=10**12)


class KeyCreate(_Strict):
    name: str = Field("", max_length=200)
    expires_at: dt.datetime | None = None


class KeyRotate(_Strict):
    grace_seconds: int = Field(3600, ge=0, le=30 * 86400)


class ServiceCreate(_Strict):
    type: str
    url: str | None = Field(None, min_length=1, max_length=2000)
    name: str | None = Field(None, min_length=1, max_length=200)
    api_key: str | None = Field(None, min_length=1, max_length=4096)
    text_limit: int | None = Field(None, gt=0)
    timeout: float | None = Field(None, gt=0, le=3600)
    context_length: int | None = Field(None, ge=256, le=1 << 21)
    # Add it even though it serves decision models and a known mesh peer is too old for them (as
    # when installing one); without it, that answers 409 mesh_warning and nothing is added.
    confirm: bool = False


class ServiceUpdate(_Strict):
    url: str | None = Field(None, min_length=1, max_length=2000)
    api_key: str | None = Field(None, min_length=1, max_length=4096)
    text_limit: int | None = Field(None, gt=0)
    timeout: float | None = Field(None, gt=0, le=3600)
    context_length: int | None = Field(None, ge=256, le=1 << 21)
    version_override: str | None = Field(None, min_length=1, max_length=100)


class ModelInstallRequest(_Strict):
    model: str = Field(min_length=1, max_length=200)
    capabilities: list[str] | None = None
    public_name: str | None = Field(None, min_length=1, max_length=200)
    # Install even though a known mesh peer is too old for decision models (it then refuses
    # this node's model list); without it, such an install answers 409 mesh_warning.
    confirm: bool = False


class ModelUpdate(_Strict):
    public_name: str | None = Field(None, min_length=1, max_length=200)
    timeout: float | None = Field(None, gt=0, le=3600)
    # "labels": answer decisions by reading label-token logprobs; null: the model's own way.
    read_strategy: Literal["labels"] | None = None
    # Turn label reading on even though a known mesh peer is too old for decision models (as
    # when installing one); without it, that answers 409 mesh_warning.
    confirm: bool = False


class MeshPeerCreate(_Strict):
    url: str = Field(min_length=8, max_length=500)
