"""What ``GET /v1/models`` answers (SPEC §2): the models and aliases a project may use, in
OpenAI's shape (``object``/``data``) and in TypeSafe's (``models``) in one body, from the
in-memory registry (no database)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from app.routing.registry import ModelEntry, Registry
from app.services import catalog
from app.tenancy.principal import Principal


def listing(registry: Registry, principal: Principal) -> dict[str, Any]:
    """Every model the principal may use, then every alias whose target it may use (the
    allowlist holds for the target, as on a request: SPEC §1), by name."""
    entries = {entry.public_name: entry for entry in registry.reachable() if principal.may_use(entry.public_name)}
    named: list[tuple[str, ModelEntry, str]] = [(name, entry, describe(entry)) for name, entry in entries.items()]
    for alias, target in registry.aliases().items():
        entry = entries.get(target)
        if entry is not None and registry.alias_target(alias) == target:  # not shadowed by a model
            named.append((alias, entry, f"Alias of {target}. {describe(entry)}"))
    named.sort(key=lambda item: item[0])
    return {"object": "list", "data": [_openai(name, entry) for name, entry, _ in named],
            "models": [_typesafe(name, entry, text) for name, entry, text in named]}


def describe(entry: ModelEntry) -> str:
    """The catalog's description of the model, else what kind of model it is."""
    first = entry.replicas[0]
    known = catalog.find(first.backend_name) or catalog.find(entry.public_name)
    if known is not None and known.description:
        return known.description
    capabilities = sorted(entry.capabilities)
    return f"A {catalog.model_kind(capabilities)} model ({', '.join(capabilities) or 'no capabilities'})."


def _openai(name: str, entry: ModelEntry) -> dict[str, Any]:
    first = entry.replicas[0]
    return {"id": name, "object": "model", "created": first.created, "owned_by": first.provider,
            "capabilities": sorted(entry.capabilities)}


def _typesafe(name: str, entry: ModelEntry, description: str) -> dict[str, Any]:
    # TypeSafe's SDK (0.7.5) requires a YYYY-MM-DD string here, null included: the day this
    # gateway first had the model (1970-01-01 when unknown, as for a mesh peer's).
    created = dt.datetime.fromtimestamp(entry.replicas[0].created, dt.UTC)
    return {"name": name, "description": description, "release_date": created.date().isoformat()}
