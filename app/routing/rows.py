"""What the registry reloads from: the rows of its last read of the database, in its own terms.

The admin side (app/services/registry_rows.py) knows the tables, the read strategies' defaults and
version gating, and makes these rows; the registry only turns them into replicas. So the data plane
imports no admin code, and ``app/components.py`` hands the registry the read it reloads with.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from sqlalchemy.orm import Session


class ModelRow(NamedTuple):
    """One model on one service, as the registry needs it."""

    service_id: int
    service_name: str
    service_type: str
    url: str
    credential: str | None  # as stored (sealed by app/routing/credentials.py, or plain from before)
    text_limit: int
    service_timeout: float | None
    public_name: str
    backend_name: str
    capabilities: list[str]
    model_timeout: float | None
    created: int  # the model row's creation, in seconds since the epoch (0 when unknown)
    read_strategy: str | None  # "labels", "embeddings", or None (the model decides itself)
    gate: str | None  # why the model cannot answer decisions on its service now, or None
    salts_prefix_cache: bool  # requests carry the project's cache salt (a vLLM)
    embedding_temperature: float | None


@dataclass(frozen=True, slots=True)
class RegistryRows:
    models: list[ModelRow]
    aliases: dict[str, str]  # alias -> its target's public name
    reachable: dict[str, bool]  # service name -> whether it answered its last read


# Reads the rows in the session it is given (the registry runs it in a worker thread).
ReadRows = Callable[[Session], RegistryRows]
