"""Three `arbiter serve` processes on loopback (A joined to B, B joined to C), each with its own
database and emulated Ollama (issue 6), and a fourth with the wrong mesh key."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from app.db.models import Project, UsageRecord
from app.db.session import Database
from infra_adapters.emulators.ollama import OllamaState, make_ollama_app
from infra_adapters.emulators.server import EmulatorServer
from tests.e2e.conftest import ARBITER, environment, run, wait_ready
from tests.support import decision, free_port, wait_for

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("ARBITER_TEST_DATABASE_URL")),
    reason="each node has its own SQLite database: this runs once, in the SQLite pass")
MESH_KEY = "e2e-mesh-key-of-the-whole-process-tests-0123"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@dataclass
class ServedNode:
    name: str
    url: str
    env: dict[str, str]
    database_url: str
    key: str
    admin: str
    ollama: OllamaState
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen([ARBITER, "serve", "--port", self.url.rsplit(":", 1)[1]], env=self.env,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_ready(f"{self.url}/readyz", self.process)

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def decide(self, model: str, **headers: str) -> httpx.Response:
        return httpx.post(f"{self.url}/v1/systemone", json=decision(model), timeout=30,
                          headers={"Authorization": f"Bearer {self.key}", **headers})

    def admin_call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.request(method, f"{self.url}{path}", timeout=30,
                             headers={"Authorization": f"Bearer {self.admin}"}, **kwargs)

    def usage(self) -> list[tuple[str, str, str | None]]:
        """The answered requests this node billed: (model, project, provider)."""
        database = Database(self.database_url)
        try:
            with database.session() as session:
                return [(r.model, p.name if p else "", r.provider) for r, p in session.execute(
                    select(UsageRecord, Project).outerjoin(Project, Project.id == UsageRecord.project_id)
                    .where(UsageRecord.status == 200))]
        finally:
            database.dispose()


@pytest.fixture
def make_node(tmp_path: Path) -> Iterator[Any]:
    nodes: list[ServedNode] = []
    emulators: list[EmulatorServer] = []

    def make(name: str, peers: list[ServedNode] = (), mesh_key: str = MESH_KEY) -> ServedNode:  # type: ignore[assignment]
        state = OllamaState()
        state.models = {}
        emulator = EmulatorServer(make_ollama_app(state)).start()
        emulators.append(emulator)
        database_url = f"sqlite:///{tmp_path / name}.db"
        url = f"http://127.0.0.1:{free_port()}"
        env = {**environment(database_url), "ARBITER_MESH_KEY": mesh_key, "ARBITER_MESH_NODE_NAME": name,
               "ARBITER_MESH_URL": url, "ARBITER_MESH_PEERS": ",".join(p.url for p in peers),
               "ARBITER_FLUSH_INTERVAL": "0.2", "ARBITER_SECRET_KEY": "e2e-secret-key-of-the-whole-process-tests"}
        run(["migrate"], env)
        run(["service", "add", "--type", "ollama", "--url", emulator.url, "--name", "ollama"], env)
        run(["project", "create", f"shop-{name}"], env)
        key = run(["key", "create", "--project", f"shop-{name}"], env).stdout.strip().splitlines()[-1]
        admin = run(["admin", "create-key"], env).stdout.strip().splitlines()[-1]
        node = ServedNode(name, url, env, database_url, key, admin, state)
        node.start()
        nodes.append(node)
        return node

    yield make
    for node in nodes:
        if node.process is not None and node.process.poll() is None:
            node.process.kill()
            node.process.wait()
    for emulator in emulators:
        emulator.stop()


def _within(seconds: float, check: Any) -> float:
    started = time.monotonic()
    wait_for(check, timeout=seconds)
    return time.monotonic() - started


def test_three_served_nodes_share_their_models(make_node: Any) -> None:
    c = make_node("node-c")
    b = make_node("node-b", [c])
    a = make_node("node-a", [b])

    installed = c.admin_call("POST", "/admin/services/ollama/models", json={"model": "tev1"})
    assert installed.status_code == 202, installed.text
    _within(15, lambda: a.decide("tev1").status_code == 200)

    # Through A to C: the trace context travels, the answer names the public model.
    response = a.decide("tev1", traceparent=TRACEPARENT)
    assert response.status_code == 200 and response.json()["model"] == "tev1"
    assert c.ollama.requests[-1].header("traceparent") == TRACEPARENT
    # Billed once, on A, to the caller's project.
    wait_for(lambda: len(a.usage()) >= 2, timeout=5)
    assert set(a.usage()) == {("tev1", "shop-node-a", "mesh")}
    assert b.usage() == [] and c.usage() == []

    # A removal on C shows on A within 5 s.
    assert c.admin_call("DELETE", "/admin/services/ollama/models/tev1").status_code == 204
    assert _within(5, lambda: a.decide("tev1").status_code == 404) < 5

    # Killing C withdraws its models; restarting it brings them back.
    assert c.admin_call("POST", "/admin/services/ollama/models", json={"model": "tev1"}).status_code == 202
    _within(15, lambda: a.decide("tev1").status_code == 200)
    c.kill()
    assert _within(5, lambda: a.decide("tev1").status_code == 404) < 5
    peer = next(p for p in b.admin_call("GET", "/admin/mesh").json()["peers"] if p["url"] == c.url)
    assert peer["state"] == "unreachable" and peer["name"] == "node-c"
    c.start()
    _within(20, lambda: a.decide("tev1").status_code == 200)

    # The mesh as A's admin sees it.
    mesh = a.admin_call("GET", "/admin/mesh").json()
    assert mesh["node"]["name"] == "node-a" and mesh["enabled"] is True
    (to_b,) = mesh["peers"]
    assert to_b["name"] == "node-b" and to_b["state"] == "connected" and to_b["version"]
    assert [(m["name"], m["hops"]) for m in to_b["models"]] == [("tev1", 2)]


def test_a_wrong_mesh_key_is_refused_and_visible_on_both_sides(make_node: Any) -> None:
    b = make_node("node-b")
    d = make_node("node-d", [b], mesh_key="a-different-mesh-key-of-the-e2e-tests-0123")
    peer = wait_for(lambda: next((p for p in d.admin_call("GET", "/admin/mesh").json()["peers"]
                                  if p["state"] == "key_rejected"), None), timeout=10)
    assert "refused this node's mesh key" in peer["error"]
    refused = wait_for(lambda: b.admin_call("GET", "/admin/mesh").json()["refused"], timeout=10)
    assert refused[0]["peer"] == "node-d" and "wrong mesh key" in refused[0]["reason"]
    assert all(p["name"] != "node-d" for p in b.admin_call("GET", "/admin/mesh").json()["peers"])
