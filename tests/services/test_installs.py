"""Installing and removing models (SPEC §4): Ollama pulls with progress, cancel and failure,
custom models, and Ollama Cloud registrations, over real HTTP to emulators."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from app.db.models import ModelInstall, Service, utcnow
from infra_adapters.emulators.ollama import OllamaState, make_ollama_app, ollama_cloud_state
from infra_adapters.emulators.server import EmulatorServer
from tests.support import Gateway, Stack, assert_error, body, decide, public_models

Emulator = tuple[EmulatorServer, OllamaState]


def poll(admin: httpx.Client, install_id: int, timeout: float = 10.0) -> list[dict[str, Any]]:
    """Every view of the install until it is no longer running (the last one is final)."""
    views: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while not views or views[-1]["status"] == "running":
        assert time.monotonic() < deadline, views[-1]
        views.append(body(admin.get(f"/admin/installs/{install_id}"), 200))
        time.sleep(0.03)
    return views


def wait_for(check: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def service_models(admin: httpx.Client, service: str) -> dict[str, dict[str, Any]]:
    return {m["public_name"]: m for m in body(admin.get(f"/admin/services/{service}/models"), 200)["data"]}


def audit_actions(admin: httpx.Client) -> list[tuple[str, str, str]]:
    return [(e["action"], e["target"], e["request_id"])
            for e in body(admin.get("/admin/audit"), 200)["data"]]


@pytest.fixture
def own(stack: Stack) -> Iterator[Emulator]:
    """The deployment's own Ollama (type `ollama`), empty, with a pull that takes about a second."""
    state = OllamaState(models={}, pull_seconds=1.0)
    with EmulatorServer(make_ollama_app(state)) as server, stack.client("admin") as admin:
        added = body(admin.post("/admin/services", json={"type": "ollama", "url": server.url,
                                                         "name": "own"}), 201)
        assert added["type"] == "ollama" and added["models"] == []
        yield server, state


def test_a_catalog_model_is_pulled_with_progress(stack: Stack, own: Emulator) -> None:
    _, state = own
    with stack.client("admin") as admin:
        started = admin.post("/admin/services/own/models", json={"model": "tev1"})
        job = body(started, 202)
        assert (job["service"], job["model"], job["public_name"]) == ("own", "tev1:latest", "tev1")
        assert job["status"] == "running" and job["capabilities"] == ["decision"] and job["error"] is None
        again = assert_error(admin.post("/admin/services/own/models", json={"model": "tev1"}), 409,
                             "conflict_error")
        assert f"install {job['id']}" in again["error"]
        views = poll(admin, job["id"])
        final = views[-1]
        assert (final["status"], final["percent"], final["stage"], final["error"]) == (
            "succeeded", 100, "success", None)
        assert final["finished_at"] is not None
        percents = [v["percent"] for v in views]
        assert any(0 < p < 100 for p in percents), percents
        assert percents == sorted(percents), percents  # never goes back
        assert any(v["stage"].startswith("pulling ") for v in views[:-1])
        assert [i["id"] for i in body(admin.get("/admin/installs"), 200)["data"]] == [job["id"]]
        model = service_models(admin, "own")["tev1"]
        assert (model["capabilities"], model["source"], model["backend_name"]) == (
            ["decision"], "catalog", "tev1:latest")
        twice = assert_error(admin.post("/admin/services/own/models", json={"model": "tev1"}), 409,
                             "conflict_error")
        assert "already installed" in twice["error"]
        [entry] = [e for e in body(admin.get("/admin/audit"), 200)["data"] if e["action"] == "model.install"]
        assert entry["target"] == "model:own/tev1:latest"
        assert entry["request_id"] == started.headers["x-request-id"]
    assert state.find_model("tev1") is not None
    assert [r.json["model"] for r in state.requests if r.path == "/api/pull"] == ["tev1:latest"]
    assert "tev1" in public_models(stack)
    answered = decide(stack, "tev1")
    assert answered.status_code == 200 and answered.json()["model"] == "tev1"


def test_cancel_during_the_pull(stack: Stack, own: Emulator) -> None:
    _, state = own
    state.pull_seconds = 3.0
    with stack.client("admin") as admin:
        job = body(admin.post("/admin/services/own/models", json={"model": "tev1"}), 202)
        wait_for(lambda: body(admin.get(f"/admin/installs/{job['id']}"), 200)["percent"] > 0)
        cancelled = admin.post(f"/admin/installs/{job['id']}/cancel")
        view = body(cancelled, 200)
        assert view["status"] == "cancelled" and view["percent"] < 100
        assert body(admin.get(f"/admin/installs/{job['id']}"), 200)["status"] == "cancelled"
        wait_for(lambda: not state.pulling)  # the emulator saw Arbiter go away
        assert "tev1" not in service_models(admin, "own")
        assert_error(admin.post(f"/admin/installs/{job['id']}/cancel"), 409, "conflict_error")
        entry = body(admin.get("/admin/audit"), 200)["data"][0]
        assert entry["action"] == "model.install_cancel"
        assert entry["target"] == f"install:{job['id']}:tev1:latest"
        assert entry["request_id"] == cancelled.headers["x-request-id"]
    assert state.find_model("tev1") is None
    assert "tev1" not in public_models(stack)
    assert_error(decide(stack, "tev1"), 404)


def test_a_pull_error_fails_the_install(stack: Stack, own: Emulator) -> None:
    _, state = own
    state.pull_seconds = 0.2
    state.pull_errors["tev1"] = "max retries exceeded: unexpected EOF"
    with stack.client("admin") as admin:
        job = body(admin.post("/admin/services/own/models", json={"model": "tev1"}), 202)
        final = poll(admin, job["id"])[-1]
        assert final["status"] == "failed" and final["percent"] < 100
        assert "max retries exceeded: unexpected EOF" in final["error"]
        assert "tev1" not in service_models(admin, "own")
        assert_error(admin.post(f"/admin/installs/{job['id']}/cancel"), 409, "conflict_error")
        del state.pull_errors["tev1"]  # a failed install does not block the next attempt
        retry = body(admin.post("/admin/services/own/models", json={"model": "tev1"}), 202)
        assert poll(admin, retry["id"])[-1]["status"] == "succeeded"
    assert decide(stack, "tev1").status_code == 200


def test_uninstall_removes_the_model_from_ollama(stack: Stack, own: Emulator) -> None:
    _, state = own
    state.models["tev1"] = ["decision"]
    with stack.client("admin") as admin:
        body(admin.post("/admin/services/own/refresh"), 200)
        assert decide(stack, "tev1").status_code == 200
        removed = admin.delete("/admin/services/own/models/tev1")
        assert removed.status_code == 204 and removed.content == b""
        assert "tev1" not in service_models(admin, "own")
        entry = body(admin.get("/admin/audit"), 200)["data"][0]
        assert (entry["action"], entry["target"]) == ("model.uninstall", "model:own/tev1:latest")
        assert entry["request_id"] == removed.headers["x-request-id"]
        assert_error(admin.delete("/admin/services/own/models/tev1"), 404)
    assert [r.json for r in state.requests if r.path == "/api/delete"] == [{"model": "tev1:latest"}]
    assert state.find_model("tev1") is None
    assert "tev1" not in public_models(stack)
    assert "tev1" in assert_error(decide(stack, "tev1"), 404)["error"]


def test_a_custom_model_needs_its_capabilities(stack: Stack, own: Emulator) -> None:
    _, state = own
    state.pull_seconds = 0.1
    state.library["acme/ranker:v2"] = ["decision"]  # pullable, but not in Arbiter's catalog
    with stack.client("admin") as admin:
        refused = assert_error(admin.post("/admin/services/own/models", json={"model": "acme/ranker:v2"}), 400)
        assert "capabilities" in refused["error"] and "acme/ranker:v2" in refused["error"]
        job = body(admin.post("/admin/services/own/models", json={
            "model": "acme/ranker:v2", "capabilities": ["decision"], "public_name": "ranker"}), 202)
        assert poll(admin, job["id"])[-1]["status"] == "succeeded"
        model = service_models(admin, "own")["ranker"]
        assert (model["backend_name"], model["capabilities"], model["source"]) == (
            "acme/ranker:v2", ["decision"], "custom")
        body(admin.post("/admin/services/own/refresh"), 200)  # a sync keeps the admin's card
        assert service_models(admin, "own")["ranker"]["source"] == "custom"
        assert decide(stack, "ranker").status_code == 200
        assert admin.delete("/admin/services/own/models/acme/ranker:v2").status_code == 204
    assert state.find_model("acme/ranker:v2") is None
    assert_error(decide(stack, "ranker"), 404)


def test_every_install_uninstall_and_cancel_is_audited(stack: Stack, own: Emulator) -> None:
    _, state = own
    state.pull_seconds = 0.1
    with stack.client("admin") as admin:
        first = admin.post("/admin/services/own/models", json={"model": "tev1"})
        poll(admin, body(first, 202)["id"])
        removed = admin.delete("/admin/services/own/models/tev1")
        state.pull_seconds = 3.0
        second = admin.post("/admin/services/own/models", json={"model": "nimble-v3"})
        job = body(second, 202)
        cancelled = admin.post(f"/admin/installs/{job['id']}/cancel")
        assert body(cancelled, 200)["status"] == "cancelled"
        actions = audit_actions(admin)[:4]
    assert actions == [
        ("model.install_cancel", f"install:{job['id']}:nimble-v3:latest", cancelled.headers["x-request-id"]),
        ("model.install", "model:own/nimble-v3:latest", second.headers["x-request-id"]),
        ("model.uninstall", "model:own/tev1:latest", removed.headers["x-request-id"]),
        ("model.install", "model:own/tev1:latest", first.headers["x-request-id"])]


@pytest.fixture
def cloud() -> Iterator[Emulator]:
    state = ollama_cloud_state("cloud-key")
    with EmulatorServer(make_ollama_app(state)) as server:
        yield server, state


def test_ollama_cloud(stack: Stack, cloud: Emulator) -> None:
    server, state = cloud
    with stack.client("admin") as admin:
        responses = []
        keyless = assert_error(admin.post("/admin/services", json={"type": "ollama-cloud",
                                                                   "url": server.url}), 400)
        assert "api_key" in keyless["error"]
        wrong = admin.post("/admin/services", json={"type": "ollama-cloud", "url": server.url,
                                                    "api_key": "nope"})
        assert "credential" in assert_error(wrong, 400)["error"] and "nope" not in wrong.text
        added = admin.post("/admin/services", json={"type": "ollama-cloud", "url": server.url, "name": "cloud",
                                                     "api_key": "cloud-key"})
        view = body(added, 201)
        assert view["has_credential"] is True and view["version"] == "0.35.2"
        models = {m["public_name"]: m for m in view["models"]}
        assert sorted(models) == ["clef:27b", "gpt-oss:120b"]
        assert models["clef:27b"]["capabilities"] == ["decision", "vision"]
        flash = assert_error(admin.post("/admin/services/cloud/models", json={"model": "clef-flash"}), 400)
        assert "not offered by Ollama Cloud" in flash["error"]
        assert_error(admin.post("/admin/services/cloud/models",
                                json={"model": "someone/else:7b", "capabilities": ["completion"]}), 400)
        registered = admin.post("/admin/services/cloud/models", json={"model": "clef:27b"})
        assert body(registered, 201)["public_name"] == "clef:27b"
        responses += [added, registered, *(admin.get(p) for p in (
            "/admin/services", "/admin/services/cloud", "/admin/services/cloud/models", "/admin/models",
            "/admin/audit", "/admin/installs")), admin.post("/admin/services/cloud/refresh")]
        for response in responses:
            assert response.status_code in (200, 201), response.text
            assert "cloud-key" not in response.text and "api_key" not in response.text
        assert not [r for r in state.requests if r.path == "/api/pull"]  # Ollama Cloud hosts, it does not pull
    assert decide(stack, "clef:27b").status_code == 200
    assert all(r.header("authorization") == "Bearer cloud-key" for r in state.requests
               if r.path == "/v1/systemone")

    state.required_bearer = "other"  # the key was rotated at ollama.com
    rejected = assert_error(decide(stack, "clef:27b"), 500)
    assert "cloud" in rejected["error"] and "cloud-key" not in rejected["error"]
    with stack.client("admin") as admin:
        status = body(admin.post("/admin/services/cloud/refresh"), 200)
        assert status["reachable"] is False and "credential" in status["last_error"]
        fixed = body(admin.patch("/admin/services/cloud", json={"api_key": "other"}), 200)
        assert fixed["reachable"] is True and fixed["last_error"] is None
    assert decide(stack, "clef:27b").status_code == 200


def left_running(stack: Stack, model: str, seconds_ago: float) -> int:
    """A running install as a process leaves it when it is killed mid-pull (OOM, a lost node):
    last refreshed ``seconds_ago``, and no process that will ever finish it."""
    with stack.db.session() as session:
        service = session.scalar(select(Service).where(Service.name == "own"))
        assert service is not None
        job = ModelInstall(service_id=service.id, backend_name=f"{model}:latest", public_name=model,
                           capabilities=["decision"], source="catalog", actor="cli", stage="pulling 0123abcd",
                           percent=40.0, updated_at=utcnow() - dt.timedelta(seconds=seconds_ago))
        session.add(job)
        session.flush()
        return job.id


def test_an_install_whose_process_died_fails_and_can_be_done_again(stack: Stack, own: Emulator) -> None:
    _, state = own
    dead = left_running(stack, "tev1", seconds_ago=120)  # ARBITER_INSTALL_LEASE is 30 s
    with stack.client("admin") as admin:
        view = body(admin.get(f"/admin/installs/{dead}"), 200)
        assert view["status"] == "failed" and view["finished_at"] is not None
        assert "process running this install stopped" in view["error"]
        assert [i["status"] for i in body(admin.get("/admin/installs"), 200)["data"]] == ["failed"]
        assert_error(admin.post(f"/admin/installs/{dead}/cancel"), 409, "conflict_error")

        again = left_running(stack, "nimble-v3", seconds_ago=120)  # not looked at before the new install
        redo = body(admin.post("/admin/services/own/models", json={"model": "nimble-v3"}), 202)
        assert poll(admin, redo["id"])[-1]["status"] == "succeeded"
        assert body(admin.get(f"/admin/installs/{again}"), 200)["status"] == "failed"

        cancelled = left_running(stack, "clef", seconds_ago=120)
        view = body(admin.post(f"/admin/installs/{cancelled}/cancel"), 200)
        assert view["status"] == "cancelled" and view["error"] is None  # no process to wait for
    assert state.find_model("nimble-v3") is not None and decide(stack, "nimble-v3").status_code == 200


def test_a_cancel_of_an_install_nobody_runs_ends_it_when_its_lease_runs_out(
        stack: Stack, own: Emulator, gateway_factory: Callable[..., Gateway]) -> None:
    with gateway_factory(install_lease=1.0).client(stack.admin_key) as admin:
        orphan = left_running(stack, "tev1", seconds_ago=0)  # its process died a moment ago
        asked = body(admin.post(f"/admin/installs/{orphan}/cancel"), 200)
        assert asked["status"] == "running"  # it could be alive on another replica: it is asked to stop
        views = poll(admin, orphan, timeout=5)
        assert views[-1]["status"] == "cancelled"


def test_a_silent_pull_keeps_its_lease_and_a_cancel_from_another_replica_reaches_it(
        stack: Stack, own: Emulator, gateway_factory: Callable[..., Gateway]) -> None:
    _, state = own
    state.pull_seconds, state.verify_seconds = 0.2, 3.0  # Ollama says nothing for 3 s at "verifying"
    # A lease shorter than the silence, with room for a refresh (every sixth of it) to be late on a
    # loaded CI machine: with 1 s, a refresh held up past it let the other replica reap the job.
    runner, other = gateway_factory(install_lease=2.0), gateway_factory(install_lease=2.0)
    with runner.client(stack.admin_key) as admin, other.client(stack.admin_key) as elsewhere:
        job = body(admin.post("/admin/services/own/models", json={"model": "tev1"}), 202)
        views = poll(elsewhere, job["id"])  # read on the replica that does not run it
        assert [v["status"] for v in views[:-1]] == ["running"] * (len(views) - 1)
        assert views[-1]["status"] == "succeeded" and views[-1]["error"] is None

        job = body(admin.post("/admin/services/own/models", json={"model": "nimble-v3"}), 202)
        wait_for(lambda: body(elsewhere.get(f"/admin/installs/{job['id']}"), 200)["stage"].startswith("verifying"))
        started = time.monotonic()
        assert body(elsewhere.post(f"/admin/installs/{job['id']}/cancel"), 200)["status"] == "running"
        final = poll(elsewhere, job["id"])[-1]
        assert final["status"] == "cancelled" and time.monotonic() - started < 1.5  # not at the end of the pull
    assert state.find_model("nimble-v3") is None
