"""What the public routes served by FastAPI answer (routes.py), as the OpenAPI document describes
it: documentation only, as for the admin API (app/api/admin/answers.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from app.api.admin.answers import UsageRow


class OpenAIModel(BaseModel):
    id: str = Field(description="the public name (a model's or an alias's)")
    object: Literal["model"]
    created: int = Field(description="Unix time this deployment first had the model")
    owned_by: str = Field(description="the provider: ollama, vllm, ...")
    capabilities: list[str]


class TypeSafeModel(BaseModel):
    name: str
    description: str
    release_date: str = Field(description="YYYY-MM-DD, never null (TypeSafe's SDK refuses null)")


class ModelListing(BaseModel):
    """The models and aliases the key's project may use, by name: OpenAI's shape (``object``,
    ``data``) and TypeSafe's (``models``) in one body."""

    object: Literal["list"]
    data: list[OpenAIModel]
    models: list[TypeSafeModel]


class ProjectUsage(BaseModel):
    project: str
    since: str | None = Field(description="the first day counted, or null for all")
    until: str | None
    data: list[UsageRow]
    next: str | None = Field(None, description="the cursor of the next page (pass it as ?cursor=), null on the last")


class Alive(BaseModel):
    status: Literal["ok"]


class Ready(BaseModel):
    status: Literal["ready", "degraded"] = Field(description="degraded: the database is unreachable; keys "
                                                 "verified lately and the models last loaded serve meanwhile")
    database: Literal["unreachable"] | None = Field(None, description="with the database unreachable only")
    reason: str | None = Field(None, description="why the database is unreachable: the kind of failure")
    redis: Literal["ok", "unreachable"] | None = Field(None, description="with ARBITER_REDIS_URL only")
    rate_limits: Literal["shared", "local_share", "open", "closed"] | None = Field(
        None, description="with ARBITER_REDIS_URL only: how limits are counted now (shared in Redis; while it is "
        "unreachable, each replica's share of each limit, or as ARBITER_RATE_LIMIT_FALLBACK says)")
    replicas: int | None = Field(None, description="with ARBITER_REDIS_URL only: the replicas counted live, "
                                 "which divide each limit while Redis is unreachable")
    degraded: str | None = Field(None, description="with Redis unreachable: what rate-limited requests get")


class NotReady(BaseModel):
    status: Literal["not ready"]
    reason: str = Field(description="what kind of failure; never hosts, users or SQL")
