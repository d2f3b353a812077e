"""Mesh nodes in this process: each an Arbiter with its own database and emulated Ollama."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.db import migrate
from app.db.session import Database
from infra_adapters.emulators.ollama import OllamaState, make_ollama_app
from infra_adapters.emulators.server import EmulatorServer
from tests.support import Gateway, Stack, start_gateway, wait_for

MESH_KEY = "the-mesh-secret-of-this-test-suite-0123456789"


@dataclass
class Node:
    name: str
    stack: Stack
    gateway: Gateway
    ollama: OllamaState

    @property
    def url(self) -> str:
        return self.gateway.url

    def client(self) -> httpx.Client:
        return self.stack.client()

    def admin(self) -> httpx.Client:
        return self.stack.client("admin")

    def mesh(self) -> dict[str, Any]:
        response = self.admin().get("/admin/mesh")
        assert response.status_code == 200, response.text
        return response.json()  # type: ignore[no-any-return]

    def peer(self, name: str) -> dict[str, Any] | None:
        return next((p for p in self.mesh()["peers"] if p["name"] == name), None)


@pytest.fixture
def mesh_node(db: Database, tmp_path: Path) -> Iterator[Callable[..., Node]]:
    """``mesh_node(name, models={...}, peers=[url], **settings)``; the first node made uses the
    suite's database (PostgreSQL in that pass), the others SQLite files."""
    made: list[tuple[Gateway, EmulatorServer, Database]] = []

    def make(name: str, *, models: dict[str, list[str]] | None = None, peers: list[str] = (),  # type: ignore[assignment]
             mesh_key: str | None = MESH_KEY, **settings: Any) -> Node:
        state = OllamaState()
        state.models = dict(models or {})
        emulator = EmulatorServer(make_ollama_app(state)).start()
        if made:
            url = f"sqlite:///{tmp_path / (name + '.db')}"
            migrate.upgrade(url)
            database = Database(url)
        else:
            database = db
        stack = Stack.provision(database, ollama_url=emulator.url)
        values: dict[str, Any] = {"mesh_node_name": name, "mesh_peers": ",".join(peers), "mesh_interval": 0.3,
                                  "mesh_max_backoff": 1.0, "sync_interval": 0.5, **settings}
        if mesh_key is not None:
            values["mesh_key"] = mesh_key
        gateway = start_gateway(database.url, **values)
        stack.gateway = gateway
        made.append((gateway, emulator, database))
        # The service's models are read in the background at start-up.
        if models:
            wait_for(lambda: all(gateway.app.components.registry.find(m) for m in models), timeout=10)
        return Node(name, stack, gateway, state)

    yield make
    for gateway, emulator, database in reversed(made):
        gateway.stop()
        emulator.stop()
        if database is not db:
            database.dispose()
