"""The model catalog that ships with Arbiter (catalog.json beside this file)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

CAPABILITIES = frozenset({"decision", "completion", "embedding", "vision", "audio", "video",
                          "tools", "thinking"})


@dataclass(frozen=True)
class CatalogModel:
    name: str
    capabilities: tuple[str, ...]
    services: tuple[str, ...]
    description: str
    size: str

    @property
    def kind(self) -> str:
        return model_kind(self.capabilities)

    def view(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "capabilities": list(self.capabilities),
                "services": list(self.services), "description": self.description, "size": self.size}


def model_kind(capabilities: Any) -> str:
    """The one-word type of a model: decision, completion, embedding (or other)."""
    caps = set(capabilities)
    for kind in ("decision", "completion", "embedding"):
        if kind in caps:
            return kind
    return "other"


@cache
def entries() -> tuple[CatalogModel, ...]:
    data = json.loads((Path(__file__).with_name("catalog.json")).read_text())
    return tuple(
        CatalogModel(name=m["name"], capabilities=tuple(m["capabilities"]), services=tuple(m["services"]),
                     description=m.get("description", ""), size=m.get("size", ""))
        for m in data["models"]
    )


def find(name: str) -> CatalogModel | None:
    """The catalog entry for a model name ("nimble" and "nimble:latest" are one)."""
    wanted = name.removesuffix(":latest")
    return next((m for m in entries() if m.name == wanted), None)
