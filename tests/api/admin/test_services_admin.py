"""The admin API for services and their models (SPEC §4), over real HTTP to emulators."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from aiohttp import web

from infra_adapters.emulators.ollama import OllamaState, make_ollama_app
from infra_adapters.emulators.server import EmulatorServer
from infra_adapters.emulators.vllm import VllmState, make_vllm_app
from tests.support import (
    Gateway,
    Stack,
    assert_error,
    body,
    closed_port,
    decide,
    public_models,
    wait_for,
)

GATE = "Decision models need Ollama 0.35.0 or newer; this Ollama is 0.34.9."


@pytest.fixture
def lab() -> Iterator[tuple[EmulatorServer, OllamaState]]:
    """A second Ollama, run by someone else, with a model the stack's own Ollama lacks."""
    state = OllamaState(models={"tev1": ["decision"], "nimble": ["decision"],
                                "qwen3:0.6b": ["completion", "tools", "thinking"]})
    with EmulatorServer(make_ollama_app(state)) as server:
        yield server, state


@pytest.fixture
def old_ollama() -> Iterator[tuple[EmulatorServer, OllamaState]]:
    state = OllamaState(version="0.34.9", models={"tev1": ["decision"], "llama3.2": ["completion"]})
    with EmulatorServer(make_ollama_app(state)) as server:
        yield server, state


def test_add_an_external_ollama(stack: Stack, lab: tuple[EmulatorServer, OllamaState]) -> None:
    server, state = lab
    with stack.client("admin") as admin:
        added = body(admin.post("/admin/services", json={"type": "ollama-external", "url": server.url + "/",
                                                         "name": "lab"}), 201)
        assert (added["name"], added["type"], added["url"]) == ("lab", "ollama-external", server.url)
        assert added["version"] == "0.35.0" and added["reachable"] is True
        assert added["decisions_supported"] is True and added["skipped_models"] == []
        models = {m["public_name"]: m for m in added["models"]}
        assert sorted(models) == ["nimble", "qwen3:0.6b", "tev1"]
        assert models["tev1"]["capabilities"] == ["decision"]
        assert models["tev1"]["backend_name"] == "tev1:latest" and models["tev1"]["service"] == "lab"
        assert models["qwen3:0.6b"]["capabilities"] == ["completion", "thinking", "tools"]
        assert [s["name"] for s in body(admin.get("/admin/services"), 200)["data"]] == ["lab", "ollama"]
        got = body(admin.get("/admin/services/lab"), 200)
        assert got == {k: v for k, v in added.items() if k != "models"}
        listed = body(admin.get("/admin/services/lab/models"), 200)["data"]
        assert [m["public_name"] for m in listed] == ["nimble", "qwen3:0.6b", "tev1"]
        replicas = [m["service"] for m in body(admin.get("/admin/models"), 200)["data"]
                    if m["public_name"] == "nimble"]
        assert replicas == ["lab", "ollama"]
    assert "tev1" in public_models(stack)
    assert decide(stack, "tev1").status_code == 200
    assert [r.path for r in state.requests if r.path == "/v1/systemone"] == ["/v1/systemone"]


def test_a_service_gets_a_name_from_its_url(stack: Stack, lab: tuple[EmulatorServer, OllamaState]) -> None:
    server, _ = lab
    with stack.client("admin") as admin:
        added = body(admin.post("/admin/services", json={"type": "ollama-external", "url": server.url}), 201)
    assert added["name"] == f"ollama-external-127.0.0.1-{server.port}"


def test_add_a_vllm(stack: Stack, vllm: tuple[EmulatorServer, VllmState]) -> None:
    server, _ = vllm
    with stack.client("admin") as admin:
        added = body(admin.post("/admin/services", json={"type": "vllm", "url": server.url, "name": "gpu"}), 201)
        assert added["type"] == "vllm" and added["version"] == "0.11.0" and added["decisions_supported"]
        [model] = added["models"]
        assert model["public_name"] == model["backend_name"] == "Qwen/Qwen3-0.6B"
        assert {"completion", "decision"} <= set(model["capabilities"])
        assert body(admin.get("/admin/services/gpu"), 200)["type"] == "vllm"
    assert "Qwen/Qwen3-0.6B" in public_models(stack)
    assert decide(stack, "Qwen/Qwen3-0.6B").status_code == 200


def test_an_api_key_is_used_but_never_shown(stack: Stack, vllm: tuple[EmulatorServer, VllmState]) -> None:
    server, state = vllm
    secret = "sk-vllm-secret-7d3f9a"
    state.required_bearer = secret
    with stack.client("admin") as admin:
        refused = assert_error(admin.post("/admin/services", json={"type": "vllm", "url": server.url}), 400)
        assert "credential" in refused["error"]
        added = admin.post("/admin/services", json={"type": "vllm", "url": server.url, "name": "gpu",
                                                     "api_key": secret})
        assert body(added, 201)["has_credential"] is True
        responses = [added, *(admin.get(p) for p in ("/admin/services", "/admin/services/gpu",
                                                      "/admin/services/gpu/models", "/admin/models",
                                                      "/admin/audit")),
                     admin.post("/admin/services/gpu/refresh")]
    for response in responses:
        assert response.status_code in (200, 201)
        assert secret not in response.text and "api_key" not in response.text
    assert decide(stack, "Qwen/Qwen3-0.6B").status_code == 200


def test_refresh_picks_up_models_added_and_removed(stack: Stack) -> None:
    stack.ollama_state.models["tev1"] = ["decision"]
    del stack.ollama_state.models["clef"]
    with stack.client("admin") as admin:
        refreshed = body(admin.post("/admin/services/ollama/refresh"), 200)
        assert refreshed["reachable"] is True and refreshed["last_error"] is None
        listed = body(admin.get("/admin/services/ollama/models"), 200)["data"]
    assert [m["public_name"] for m in listed] == ["llama3.2", "nimble", "tev1"]
    assert public_models(stack) == ["llama3.2", "nimble", "tev1"]
    assert decide(stack, "tev1").status_code == 200
    assert_error(decide(stack, "clef"), 404)


def test_refreshing_an_unreachable_service_reports_it(stack: Stack) -> None:
    stack.ollama.stop()
    try:
        with stack.client("admin") as admin:
            down = body(admin.post("/admin/services/ollama/refresh"), 200)
            assert down["reachable"] is False and stack.ollama.url in down["last_error"]
            assert body(admin.get("/admin/services/ollama"), 200)["reachable"] is False
    finally:
        stack.ollama.start()
    with stack.client("admin") as admin:
        up = body(admin.post("/admin/services/ollama/refresh"), 200)
    assert up["reachable"] is True and up["last_error"] is None


def test_delete_a_service(stack: Stack) -> None:
    assert decide(stack, "nimble").status_code == 200
    with stack.client("admin") as admin:
        deleted = admin.delete("/admin/services/ollama")
        assert deleted.status_code == 204 and deleted.content == b""
        assert_error(admin.get("/admin/services/ollama"), 404)
        assert body(admin.get("/admin/models"), 200)["data"] == []
        assert_error(admin.delete("/admin/services/ollama"), 404)
    error = assert_error(decide(stack, "nimble"), 404)
    assert "nimble" in error["error"]
    assert public_models(stack) == []


def test_an_old_ollama_is_added_without_its_decision_models_until_updated(
        stack: Stack, old_ollama: tuple[EmulatorServer, OllamaState]) -> None:
    server, state = old_ollama
    with stack.client("admin") as admin:
        added = body(admin.post("/admin/services", json={"type": "ollama-external", "url": server.url,
                                                         "name": "old"}), 201)
        assert added["version"] == "0.34.9" and added["decisions_supported"] is False
        assert [m["public_name"] for m in added["models"]] == ["llama3.2"]
        assert [s["reason"] for s in added["skipped_models"]] == [GATE]
        assert "tev1" in added["skipped_models"][0]["model"]
        assert body(admin.get("/admin/services/old"), 200)["skipped_models"] == added["skipped_models"]
        assert_error(decide(stack, "tev1"), 404)

        state.version = "0.35.1"
        refreshed = body(admin.post("/admin/services/old/refresh"), 200)
        assert refreshed["version"] == "0.35.1" and refreshed["decisions_supported"] is True
        assert refreshed["skipped_models"] == []
        listed = body(admin.get("/admin/services/old/models"), 200)["data"]
    assert {m["public_name"]: m["capabilities"] for m in listed} == {"llama3.2": ["completion", "tools"],
                                                                     "tev1": ["decision"]}
    assert "tev1" in public_models(stack)
    assert decide(stack, "tev1").status_code == 200


def test_service_errors(stack: Stack, lab: tuple[EmulatorServer, OllamaState]) -> None:
    server, _ = lab
    port = closed_port()
    with stack.client("admin") as admin:
        before = body(admin.get("/admin/audit"), 200)["data"]
        unknown = assert_error(admin.post("/admin/services", json={"type": "llamafile", "url": server.url}), 400)
        assert "llamafile" in unknown["error"] and "ollama-external" in unknown["error"]
        down = assert_error(admin.post("/admin/services", json={"type": "ollama-external",
                                                                "url": f"http://127.0.0.1:{port}"}), 400)
        assert down["error"] == (f"cannot add service 'ollama-external-127.0.0.1-{port}': could not read "
                                 f"ollama-external backend at http://127.0.0.1:{port}: it did not answer as an "
                                 "ollama-external server (see the server log)")
        for url in ("ftp://127.0.0.1/models", "127.0.0.1:11434", "http://", "file:///etc/passwd"):
            bad = assert_error(admin.post("/admin/services", json={"type": "ollama-external", "url": url}), 400)
            assert "http(s)://" in bad["error"], bad
        assert_error(admin.post("/admin/services", json={"type": "ollama-external", "url": ""}), 400)
        assert_error(admin.post("/admin/services", json={"type": "vllm", "url": server.url, "gpu": 1}), 400)
        assert_error(admin.post("/admin/services", json={"url": server.url}), 400)
        taken = assert_error(admin.post("/admin/services", json={"type": "ollama-external", "url": server.url,
                                                                 "name": "ollama"}), 409, "conflict_error")
        assert "ollama" in taken["error"]
        for method, path in (("GET", "/admin/services/nope"), ("DELETE", "/admin/services/nope"),
                             ("POST", "/admin/services/nope/refresh"), ("GET", "/admin/services/nope/models")):
            assert "nope" in assert_error(admin.request(method, path), 404)["error"]
        assert [s["name"] for s in body(admin.get("/admin/services"), 200)["data"]] == ["ollama"]
        assert body(admin.get("/admin/audit"), 200)["data"] == before


def test_service_changes_are_audited(stack: Stack, lab: tuple[EmulatorServer, OllamaState]) -> None:
    server, _ = lab
    with stack.client("admin") as admin:
        added = admin.post("/admin/services", json={"type": "ollama-external", "url": server.url, "name": "lab"})
        deleted = admin.delete("/admin/services/lab")
        entries = body(admin.get("/admin/audit", params={"limit": 2}), 200)["data"]
    assert [(e["action"], e["target"], e["request_id"]) for e in entries] == [
        ("service.delete", "service:lab", deleted.headers["X-Request-Id"]),
        ("service.create", "service:lab", added.headers["X-Request-Id"])]
    assert entries[1]["details"] == {"type": "ollama-external", "url": server.url}
    assert entries[0]["actor"].startswith("admin-key:")


def test_refresh_is_audited_with_what_it_changed(stack: Stack) -> None:
    stack.ollama_state.models["tev1"] = ["decision"]
    with stack.client("admin") as admin:
        response = admin.post("/admin/services/ollama/refresh")
        assert response.status_code == 200
        entry = admin.get("/admin/audit").json()["data"][0]
    assert entry["action"] == "service.refresh" and entry["target"] == "service:ollama"
    assert entry["request_id"] == response.headers["x-request-id"]
    assert entry["details"]["added"] == ["tev1:latest"] and entry["details"]["removed"] == []


def test_a_backend_that_rejects_arbiters_key_on_a_request_shows_in_the_service_status(
        stack: Stack, vllm: tuple[EmulatorServer, VllmState]) -> None:
    server, state = vllm
    state.required_bearer = "sk-first"
    chat_state = VllmState(required_bearer="sk-chat")
    with EmulatorServer(make_vllm_app(chat_state)) as chat_server, stack.client("admin") as admin:
        body(admin.post("/admin/services", json={"type": "vllm", "url": server.url, "name": "gpu",
                                                 "api_key": "sk-first"}), 201)
        chat_state.models = {"chat-only": {}}
        body(admin.post("/admin/services", json={"type": "vllm", "url": chat_server.url, "name": "chatbox",
                                                 "api_key": "sk-chat"}), 201)
        assert decide(stack, "Qwen/Qwen3-0.6B").status_code == 200
        state.required_bearer = chat_state.required_bearer = "rotated"  # the keys were changed there

        assert_error(decide(stack, "Qwen/Qwen3-0.6B"), 500, "upstream_auth_error")
        with stack.client() as client:
            chat = client.post("/v1/chat/completions", json={"model": "chat-only", "max_tokens": 4,
                                                             "messages": [{"role": "user", "content": "hi"}]})
        assert_error(chat, 500, "upstream_auth_error")
        for name, url in (("gpu", server.url), ("chatbox", chat_server.url)):
            view = wait_for(lambda name=name: (v := body(admin.get(f"/admin/services/{name}"), 200))["last_error"]
                            and v)
            assert view["last_error"].startswith(f"{url} rejected Arbiter's credential")
            assert "sk-" not in view["last_error"] and "rotated" not in view["last_error"]
        listed = {s["name"]: s for s in body(admin.get("/admin/services"), 200)["data"]}
        assert "rejected Arbiter's credential" in listed["gpu"]["last_error"]

        fixed = body(admin.patch("/admin/services/gpu", json={"api_key": "rotated"}), 200)
        assert fixed["last_error"] is None and fixed["reachable"] is True  # the new key was read with
    assert decide(stack, "Qwen/Qwen3-0.6B").status_code == 200


@pytest.fixture
def trickling() -> Iterator[tuple[EmulatorServer, dict[str, float]]]:
    """An Ollama whose /api/version answers one byte every ``pace["delay"]`` seconds (0: at once);
    ``pace["reads"]`` counts the slow answers begun."""
    pace = {"delay": 0.0, "reads": 0.0}

    @web.middleware
    async def trickle(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path != "/api/version" or not pace["delay"]:
            return await handler(request)  # type: ignore[no-any-return]
        pace["reads"] += 1
        answer = b'{"version":"0.35.0"}'
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = len(answer)
        await response.prepare(request)
        for byte in answer:  # every read returns within any read timeout: only a total deadline helps
            await response.write(bytes([byte]))
            await asyncio.sleep(pace["delay"])
        return response

    app = make_ollama_app(OllamaState(models={"llama3.2": ["completion"]}))
    app.middlewares.insert(0, trickle)
    with EmulatorServer(app) as server:
        yield server, pace


def test_an_admin_call_to_a_trickling_backend_ends_at_the_admin_timeout(
        stack: Stack, trickling: tuple[EmulatorServer, dict[str, float]],
        gateway_factory: Callable[..., Gateway]) -> None:
    server, pace = trickling
    with gateway_factory(backend_admin_timeout=1.0).client(stack.admin_key) as admin:
        body(admin.post("/admin/services", json={"type": "ollama-external", "url": server.url, "name": "slow"}), 201)
        pace["delay"] = 0.5  # the whole answer would take 10 s
        started = time.monotonic()
        refused = assert_error(admin.post("/admin/services", json={"type": "ollama-external", "url": server.url,
                                                                   "name": "slower"}), 400)
        assert time.monotonic() - started < 2.5
        assert refused["error"].endswith(f"{server.url}: it did not answer as an ollama-external server "
                                         "(see the server log)")  # which way it failed: in the log
        started = time.monotonic()
        refreshed = body(admin.post("/admin/services/slow/refresh"), 200)
        assert time.monotonic() - started < 2.5
        assert refreshed["reachable"] is False and "did not answer as" in refreshed["last_error"]


def test_a_slow_backend_read_does_not_hold_up_other_admin_writes(
        stack: Stack, trickling: tuple[EmulatorServer, dict[str, float]]) -> None:
    server, pace = trickling
    pace["delay"] = 0.15  # the version takes 3 s to arrive: within the admin timeout (10 s)
    slow_calls: list[Callable[[httpx.Client], httpx.Response]] = [
        lambda admin: admin.post("/admin/services", json={"type": "ollama-external", "url": server.url,
                                                          "name": "slow"}),
        lambda admin: admin.patch("/admin/services/slow", json={"api_key": "k2"}),  # a new key: read again
    ]
    for number, slow_call in enumerate(slow_calls):
        with ThreadPoolExecutor(1) as pool, stack.client("admin") as admin:
            slow = pool.submit(slow_call, admin)
            wait_for(lambda number=number: pace["reads"] > number)  # its backend read has begun
            started = time.monotonic()
            body(admin.post("/admin/projects", json={"name": f"meanwhile-{number}", "models": "all"}), 201)
            took = time.monotonic() - started
            assert body(slow.result(), 200 if number else 201)["version"] == "0.35.0"
        assert took < 1.0, f"another admin write waited {took:.1f}s for a backend read"
