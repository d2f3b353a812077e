"""Version gating of decision models on Ollama (SPEC §4), end to end over real HTTP:
registering, skipping, installing, and lifting the gate without restarting Arbiter."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from aiohttp import web

from app.db.models import Lease, utcnow
from app.db.session import Database
from app.services.sync import LEASE
from infra_adapters.emulators.ollama import OllamaState, make_ollama_app
from infra_adapters.emulators.server import EmulatorServer
from tests.support import Gateway, Stack, add_service, assert_error, body, decide, public_models, wait_for

# Only 0.35.0's own pre-releases are older.
VERSIONS = [("0.34.9", False), ("0.35.0", True), ("0.35.1", True), ("0.40.4", True),
            ("0.35.0-rc1", False), ("0.0.0", False), ("junk", False),
            ("0.36.0-rc1", True), ("0.35.1-rc0", True), ("0.35.0+build", True)]


def gate(version: str) -> str:
    return f"Decision models need Ollama 0.35.0 or newer; this Ollama is {version}."


def finished(admin: httpx.Client, install_id: int, timeout: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        view = body(admin.get(f"/admin/installs/{install_id}"), 200)
        if view["status"] != "running":
            return view  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, view
        time.sleep(0.05)


def install(admin: httpx.Client, service: str, model: str) -> dict[str, Any]:
    started = body(admin.post(f"/admin/services/{service}/models", json={"model": model}), 202)
    return finished(admin, started["id"])


def names(models: list[dict[str, Any]]) -> list[str]:
    return sorted(m["public_name"] for m in models)


@pytest.fixture
def lab() -> Iterator[tuple[EmulatorServer, OllamaState]]:
    """An Ollama run by someone else with one decision and one chat model; pulls are quick."""
    state = OllamaState(models={"tev1": ["decision"], "llama3.2": ["completion", "tools"]},
                        pull_seconds=0.05)
    with EmulatorServer(make_ollama_app(state)) as server:
        yield server, state


@pytest.fixture
def odd_version() -> Iterator[tuple[EmulatorServer, OllamaState, dict[str, str | None]]]:
    """``lab``'s Ollama behind something that may spoil /api/version: ``mode["answer"]`` set to
    "404" (Go's plain-text 404) or "text" (a 200 that is not JSON); None: Ollama's own answer."""
    state = OllamaState(models={"tev1": ["decision"], "llama3.2": ["completion", "tools"]})
    mode: dict[str, str | None] = {"answer": None}

    @web.middleware
    async def spoil(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path == "/api/version" and mode["answer"] == "404":
            return web.Response(status=404, text="404 page not found")
        if request.path == "/api/version" and mode["answer"] == "text":
            return web.Response(text="0.36.0", content_type="text/plain")
        return await handler(request)  # type: ignore[no-any-return]

    app = make_ollama_app(state)
    app.middlewares.insert(0, spoil)
    with EmulatorServer(app) as server:
        yield server, state, mode


def add(admin: httpx.Client, server: EmulatorServer, name: str = "lab",
        service_type: str = "ollama-external") -> dict[str, Any]:
    return body(admin.post("/admin/services", json={"type": service_type, "url": server.url,
                                                    "name": name}), 201)  # type: ignore[no-any-return]


@pytest.mark.parametrize(("version", "new_enough"), VERSIONS)
def test_version_matrix(stack: Stack, lab: tuple[EmulatorServer, OllamaState], version: str,
                        new_enough: bool) -> None:
    server, state = lab
    state.version = version
    with stack.client("admin") as admin:
        added = add(admin, server)
        assert added["version"] == version and added["reachable"] is True
        assert added["decisions_supported"] is new_enough
        if new_enough:
            assert names(added["models"]) == ["llama3.2", "tev1"]
            assert added["skipped_models"] == [] and added["decisions_message"] is None
        else:
            assert names(added["models"]) == ["llama3.2"]
            assert added["skipped_models"] == [{"model": "tev1", "backend_name": "tev1:latest",
                                                "reason": gate(version)}]
            assert added["decisions_message"] == gate(version)
        assert body(admin.get("/admin/services/lab"), 200)["skipped_models"] == added["skipped_models"]

        attempt = admin.post("/admin/services/lab/models", json={"model": "nimble-v3"})
        if new_enough:
            assert finished(admin, body(attempt, 202)["id"])["status"] == "succeeded"
            assert state.find_model("nimble-v3") is not None
        else:
            custom = admin.post("/admin/services/lab/models",
                                json={"model": "in-house-judge", "capabilities": ["decision"]})
            for refused in (attempt, custom):
                assert assert_error(refused, 400)["error"] == gate(version)
            assert not [r for r in state.requests if r.path == "/api/pull"]  # refused before any pull
            assert state.find_model("nimble-v3") is None
        chat_model = install(admin, "lab", "qwen3:0.6b")  # not a decision model: never gated
        assert chat_model["status"] == "succeeded" and chat_model["percent"] == 100
        listed = names(body(admin.get("/admin/services/lab/models"), 200)["data"])
    expected = ["llama3.2", "nimble-v3", "qwen3:0.6b", "tev1"] if new_enough else ["llama3.2", "qwen3:0.6b"]
    assert listed == expected
    if new_enough:
        assert decide(stack, "tev1").status_code == 200
    else:
        assert "tev1" in assert_error(decide(stack, "tev1"), 404)["error"]


def test_the_deployments_own_ollama_is_gated_too(stack: Stack, lab: tuple[EmulatorServer, OllamaState]) -> None:
    server, state = lab
    state.version = "0.34.9"
    with stack.client("admin") as admin:
        added = add(admin, server, "own", service_type="ollama")
        assert added["type"] == "ollama" and added["decisions_supported"] is False
        assert assert_error(admin.post("/admin/services/own/models", json={"model": "tev1"}),
                            400)["error"] == gate("0.34.9")
        assert install(admin, "own", "qwen3:0.6b")["status"] == "succeeded"


def test_an_upgrade_lifts_the_gate_at_the_next_refresh(stack: Stack,
                                                       lab: tuple[EmulatorServer, OllamaState]) -> None:
    server, state = lab
    state.version = "0.34.9"
    with stack.client("admin") as admin:
        assert add(admin, server)["decisions_supported"] is False
        assert_error(admin.post("/admin/services/lab/models", json={"model": "nimble-v3"}), 400)
        assert_error(decide(stack, "tev1"), 404)

        state.version = "0.35.1"  # the running Ollama is updated; Arbiter keeps running
        refreshed = body(admin.post("/admin/services/lab/refresh"), 200)
        assert refreshed["version"] == "0.35.1" and refreshed["decisions_supported"] is True
        assert refreshed["skipped_models"] == [] and refreshed["decisions_message"] is None
        assert decide(stack, "tev1").status_code == 200
        assert install(admin, "lab", "nimble-v3")["status"] == "succeeded"
        assert decide(stack, "nimble-v3").status_code == 200

        state.version = "0.34.9"  # and downgraded again: the next read closes the gate
        again = body(admin.post("/admin/services/lab/refresh"), 200)
        assert again["decisions_supported"] is False
        assert {s["model"] for s in again["skipped_models"]} == {"tev1", "nimble-v3"}
        assert {s["reason"] for s in again["skipped_models"]} == {gate("0.34.9")}
    # Installed, then the Ollama was downgraded: 405 with why (SPEC §1), not "not installed".
    assert gate("0.34.9") in assert_error(decide(stack, "tev1"), 405, "unsupported_error")["error"]


def test_an_upgrade_lifts_the_gate_at_the_next_scheduled_sync(
        db: Database, lab: tuple[EmulatorServer, OllamaState],
        gateway_factory: Callable[..., Gateway]) -> None:
    server, state = lab
    state.version = "0.34.9"
    stack = Stack.provision(db)
    stack.gateway = gateway_factory(sync_interval=0.5)
    with stack.client("admin") as admin:
        assert add(admin, server)["decisions_supported"] is False
        assert_error(decide(stack, "tev1"), 404)
        state.version = "0.35.1"
        deadline = time.monotonic() + 10
        while not body(admin.get("/admin/services/lab"), 200)["decisions_supported"]:
            assert time.monotonic() < deadline, "the scheduled sync did not read the new version"
            time.sleep(0.1)
        view = body(admin.get("/admin/services/lab"), 200)
        assert view["version"] == "0.35.1" and view["skipped_models"] == []
        assert "tev1" in names(body(admin.get("/admin/services/lab/models"), 200)["data"])
        assert "service.refresh" not in {e["action"] for e in body(admin.get("/admin/audit"), 200)["data"]}
    deadline = time.monotonic() + 15
    while (response := decide(stack, "tev1")).status_code != 200:  # the registry follows the sync
        assert time.monotonic() < deadline, response.text
        time.sleep(0.1)


def test_a_version_override_lifts_the_gate_for_a_source_build(
        stack: Stack, lab: tuple[EmulatorServer, OllamaState]) -> None:
    server, state = lab
    state.version = "0.0.0"
    with stack.client("admin") as admin:
        added = add(admin, server)
        assert added["decisions_supported"] is False and added["decisions_message"] == gate("0.0.0")
        assert_error(admin.post("/admin/services/lab/models", json={"model": "nimble-v3"}), 400)

        patched = admin.patch("/admin/services/lab", json={"version_override": "0.35.0"})
        view = body(patched, 200)
        assert view["version"] == "0.0.0" and view["version_override"] == "0.35.0"
        assert view["decisions_supported"] is True and view["skipped_models"] == []
        with stack.client() as client:
            assert "tev1" in [m["id"] for m in body(client.get("/v1/models"), 200)["data"]]
        # Arbiter forwards now; this emulated source build has no /v1/systemone route (Ollama's
        # plain-text 404), which is a 405, not the 404 of a model that is not registered.
        assert_error(decide(stack, "tev1"), 405, "unsupported_error")
        assert [r.json["model"] for r in state.requests if r.path == "/v1/systemone"] == ["tev1:latest"]
        assert install(admin, "lab", "nimble-v3")["status"] == "succeeded"
        refreshed = body(admin.post("/admin/services/lab/refresh"), 200)  # a refresh keeps the override
        assert refreshed["decisions_supported"] is True and refreshed["version_override"] == "0.35.0"
        entry = next(e for e in body(admin.get("/admin/audit"), 200)["data"] if e["action"] == "service.update")
        assert entry["target"] == "service:lab"
        assert entry["details"] == {"version_override": "0.35.0"}
        assert entry["request_id"] == patched.headers["x-request-id"]

        cleared = body(admin.patch("/admin/services/lab", json={"version_override": None}), 200)
        assert cleared["version_override"] is None and cleared["decisions_supported"] is False
        assert {s["model"] for s in cleared["skipped_models"]} == {"tev1", "nimble-v3"}
    assert gate("0.0.0") in assert_error(decide(stack, "tev1"), 405, "unsupported_error")["error"]


def test_an_override_that_is_itself_too_old_keeps_the_gate(
        stack: Stack, lab: tuple[EmulatorServer, OllamaState]) -> None:
    server, state = lab
    state.version = "0.0.0"
    with stack.client("admin") as admin:
        add(admin, server)
        view = body(admin.patch("/admin/services/lab", json={"version_override": "0.34.0"}), 200)
        assert view["decisions_supported"] is False and view["decisions_message"] == gate("0.34.0")
        refused = admin.post("/admin/services/lab/models", json={"model": "nimble-v3"})
        assert assert_error(refused, 400)["error"] == gate("0.34.0")


@pytest.mark.parametrize("answer", ["404", "text"])
def test_a_version_that_cannot_be_read_counts_as_too_old(
        stack: Stack, odd_version: tuple[EmulatorServer, OllamaState, dict[str, str | None]], answer: str) -> None:
    server, _, mode = odd_version
    mode["answer"] = answer
    with stack.client("admin") as admin:
        added = add(admin, server)  # the service is added: only its version is unreadable
        assert added["version"] is None and added["reachable"] is True
        assert added["decisions_supported"] is False and added["decisions_message"] == gate("unknown")
        assert "/api/version" in added["last_error"] and added["last_error"].startswith("cannot read the version")
        assert names(added["models"]) == ["llama3.2"]
        assert added["skipped_models"] == [{"model": "tev1", "backend_name": "tev1:latest",
                                            "reason": gate("unknown")}]
        assert assert_error(admin.post("/admin/services/lab/models", json={"model": "nimble-v3"}),
                            400)["error"] == gate("unknown")

        view = body(admin.patch("/admin/services/lab", json={"version_override": "0.35.0"}), 200)
        assert view["decisions_supported"] is True and view["skipped_models"] == []  # the admin's word
        assert "tev1" in names(body(admin.get("/admin/services/lab/models"), 200)["data"])
    assert decide(stack, "tev1").status_code == 200


def test_a_version_that_stops_being_readable_closes_the_gate_at_refresh(
        stack: Stack, odd_version: tuple[EmulatorServer, OllamaState, dict[str, str | None]]) -> None:
    server, _, mode = odd_version
    with stack.client("admin") as admin:
        assert add(admin, server)["version"] == "0.35.0"
        assert decide(stack, "tev1").status_code == 200
        mode["answer"] = "404"
        refreshed = body(admin.post("/admin/services/lab/refresh"), 200)
        assert refreshed["version"] is None and refreshed["reachable"] is True
        assert refreshed["decisions_supported"] is False and refreshed["decisions_message"] == gate("unknown")
        assert "HTTP 404" in refreshed["last_error"]
        assert [s["model"] for s in refreshed["skipped_models"]] == ["tev1"]

        mode["answer"] = None  # readable again: the next read opens the gate and clears the error
        again = body(admin.post("/admin/services/lab/refresh"), 200)
        assert again["version"] == "0.35.0" and again["decisions_supported"] is True
        assert again["last_error"] is None and again["skipped_models"] == []
    assert decide(stack, "tev1").status_code == 200


def test_a_downgrade_after_install_stays_405_after_the_next_scheduled_sync(
        db: Database, lab: tuple[EmulatorServer, OllamaState],
        gateway_factory: Callable[..., Gateway]) -> None:
    server, state = lab
    stack = Stack.provision(db)
    stack.gateway = gateway_factory(sync_interval=0.5)
    with stack.client("admin") as admin:
        add(admin, server)
        assert decide(stack, "tev1").status_code == 200
        state.version = "0.34.9"  # the Ollama is downgraded under Arbiter: its /v1/systemone is gone
        assert_error(decide(stack, "tev1"), 405, "unsupported_error")  # before any sync: its plain-text 404
        wait_for(lambda: not body(admin.get("/admin/services/lab"), 200)["decisions_supported"])
        wait_for(lambda: gate("0.34.9") in decide(stack, "tev1").text)  # the registry follows the sync
    refused = assert_error(decide(stack, "tev1"), 405, "unsupported_error")
    assert refused["error"] == ("model 'tev1' cannot answer decisions: service 'lab' is too old. "
                                + gate("0.34.9"))
    assert "tev1" not in public_models(stack)  # not offered while it cannot answer
    with stack.client() as client:  # chat: a decision model never had it; the answer says why
        chat = client.post("/v1/chat/completions", json={"model": "tev1", "messages": [{"role": "user",
                                                                                         "content": "hi"}]})
    assert gate("0.34.9") in assert_error(chat, 400)["error"]


def test_closing_and_reopening_the_gate_keeps_the_admins_settings(
        stack: Stack, lab: tuple[EmulatorServer, OllamaState]) -> None:
    server, state = lab
    with stack.client("admin") as admin:
        add(admin, server)
        state.library["in-house-judge"] = ["decision"]  # a model of the admin's own, pullable
        card = next(m for m in body(admin.get("/admin/models"), 200)["data"] if m["public_name"] == "tev1")
        renamed = body(admin.patch(f"/admin/models/{card['id']}", json={"public_name": "triage", "timeout": 7}), 200)
        assert (renamed["public_name"], renamed["timeout"]) == ("triage", 7)
        custom = body(admin.post("/admin/services/lab/models", json={"model": "in-house-judge",
                                                                      "capabilities": ["decision"]}), 202)
        assert finished(admin, custom["id"])["status"] == "succeeded"
        assert decide(stack, "triage").status_code == 200

        state.version = "0.34.9"
        closed = body(admin.post("/admin/services/lab/refresh"), 200)
        assert closed["decisions_supported"] is False
        assert sorted(s["model"] for s in closed["skipped_models"]) == ["in-house-judge", "triage"]
        gated = {m["public_name"]: m for m in body(admin.get("/admin/services/lab/models"), 200)["data"]}
        assert sorted(gated) == ["in-house-judge", "llama3.2", "triage"]  # still there, marked
        assert gated["triage"]["id"] == card["id"] and gated["triage"]["decisions_message"] == gate("0.34.9")
        assert gated["llama3.2"]["decisions_message"] is None
        assert assert_error(decide(stack, "triage"), 405, "unsupported_error")["error"].endswith(gate("0.34.9"))
        assert_error(decide(stack, "in-house-judge"), 405, "unsupported_error")
        tested = body(admin.post(f"/admin/models/{card['id']}/test"), 200)
        assert tested["ok"] is False and tested["status"] == 405 and gate("0.34.9") in tested["error"]

        state.version = "0.35.0"
        reopened = body(admin.post("/admin/services/lab/refresh"), 200)
        assert reopened["decisions_supported"] is True and reopened["skipped_models"] == []
        audit = next(e for e in body(admin.get("/admin/audit"), 200)["data"] if e["action"] == "service.refresh")
        assert audit["details"]["added"] == [] and audit["details"]["removed"] == []
        after = {m["public_name"]: m for m in body(admin.get("/admin/services/lab/models"), 200)["data"]}
        assert sorted(after) == ["in-house-judge", "llama3.2", "triage"]
        assert (after["triage"]["id"], after["triage"]["timeout"]) == (card["id"], 7)
        assert after["triage"]["decisions_message"] is None
    assert decide(stack, "triage").status_code == 200
    assert decide(stack, "in-house-judge").status_code == 200
    assert_error(decide(stack, "tev1"), 404)  # the admin's name stays the only name


def test_the_version_is_read_at_start_up_even_while_a_killed_process_holds_the_sync_lease(
        db: Database, lab: tuple[EmulatorServer, OllamaState],
        gateway_factory: Callable[..., Gateway]) -> None:
    server, state = lab
    state.version = "0.34.9"
    stack = Stack.provision(db)
    add_service(db, type="ollama-external", url=server.url, name="lab")
    with db.session() as session:
        # What a process killed a moment ago leaves: the sync lease, for minutes more.
        session.add(Lease(name=LEASE, holder="gone-host:4242:0badc0de",
                          expires_at=utcnow() + dt.timedelta(seconds=150)))
    state.version = "0.35.1"  # the Ollama was upgraded while Arbiter was down
    stack.gateway = gateway_factory()  # Arbiter starts again (scheduled syncs every 60 s)
    with stack.client("admin") as admin:
        view = wait_for(lambda: (v := body(admin.get("/admin/services/lab"), 200))["version"] == "0.35.1" and v,
                        timeout=10)
        assert view["decisions_supported"] is True and view["skipped_models"] == []
    wait_for(lambda: decide(stack, "tev1").status_code == 200)
