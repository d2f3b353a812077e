"""Bad input on every admin endpoint for services, models and installs: SPEC §1's error
shape, 400 for what the admin sent (never 422), 404/409 where they belong, never a 5xx."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest
from aiohttp import web

from infra_adapters.emulators.ollama import OllamaState, make_ollama_app, ollama_cloud_state
from infra_adapters.emulators.server import EmulatorServer
from infra_adapters.emulators.vllm import VllmState
from tests.support import Stack, assert_error, closed_port, decision

HUGE_ID = 10**20  # past any database integer


def audit_count(admin: httpx.Client) -> int:
    return len(admin.get("/admin/audit", params={"limit": 1000}).json()["data"])


@pytest.fixture
def admin(stack: Stack) -> Iterator[httpx.Client]:
    with stack.client("admin") as client:
        yield client


def nimble_id(admin: httpx.Client) -> int:
    return int(next(m["id"] for m in admin.get("/admin/models").json()["data"] if m["public_name"] == "nimble"))


def test_add_service_bad_input(admin: httpx.Client, stack: Stack) -> None:
    url = stack.ollama.url
    audited = audit_count(admin)
    unknown = assert_error(admin.post("/admin/services", json={"type": "llamafile", "url": url}), 400)
    assert "llamafile" in unknown["error"]
    port = closed_port()
    down = assert_error(admin.post("/admin/services", json={"type": "ollama-external",
                                                            "url": f"http://127.0.0.1:{port}"}), 400)
    assert f"127.0.0.1:{port}" in down["error"]
    taken = admin.post("/admin/services", json={"type": "ollama-external", "url": url, "name": "ollama"})
    assert "ollama" in assert_error(taken, 409, "conflict_error")["error"]
    bad_bodies: list[Any] = [
        {"type": "ollama-external", "url": url, "gpus": 2},  # unknown field
        {"url": url},  # no type
        {"type": 7, "url": url},
        {"type": "ollama-external", "url": ["http://x"]},
        {"type": "ollama-external", "url": url, "name": ""},
        {"type": "ollama-external", "url": url, "name": "x" * 201},
        {"type": "ollama-external", "url": url, "name": "a/b"},  # /admin/services/{name} could not reach it
        {"type": "ollama-external", "url": url, "name": ".."},
        {"type": "ollama-external", "url": url, "api_key": ""},
        {"type": "ollama-external", "url": url, "timeout": 0},
        {"type": "ollama-external", "url": url, "timeout": -1},
        {"type": "ollama-external", "url": url, "timeout": 3601},
        {"type": "ollama-external", "url": url, "timeout": "soon"},
        {"type": "ollama-external", "url": url, "text_limit": 0},
        {"type": "ollama-external", "url": url, "text_limit": -65536},
        {"type": "ollama-external", "url": url, "text_limit": 1.5},
        {"type": "ollama-external", "url": url, "text_limit": "64k"},
        {"type": "ollama-external", "url": url, "text_limit": 10**20},
        {"type": "ollama", "url": url, "context_length": 255},
        {"type": "ollama", "url": url, "context_length": (1 << 21) + 1},
        {"type": "ollama", "url": url, "context_length": "long"},
        {"type": "ollama-external", "url": url, "context_length": 8192},  # not type ollama
        {"type": "ollama-external", "url": "http://[::1"},
        {"type": "ollama-external", "url": "http://127.0.0.1:99999"},
        {"type": "ollama-external", "url": "http://bad host:11434"},
        {"type": "ollama-external", "url": "http://127.0.0.1/\u0007"},
        {"type": "ollama-external", "url": "ftp://127.0.0.1/"},
        [],
        "ollama",
    ]
    for bad in bad_bodies:
        assert_error(admin.post("/admin/services", json=bad), 400)
    for raw in (b"", b"{", b'{"type": "ollama", "type": "vllm"}x'):
        assert_error(admin.post("/admin/services", content=raw,
                                headers={"content-type": "application/json"}), 400)
    context = assert_error(admin.post("/admin/services", json={"type": "vllm", "url": url,
                                                               "context_length": 8192}), 400)
    assert "context_length" in context["error"]
    assert [s["name"] for s in admin.get("/admin/services").json()["data"]] == ["ollama"]
    assert audit_count(admin) == audited  # refusals leave no trace


def test_update_service_bad_input(admin: httpx.Client, vllm: tuple[EmulatorServer, VllmState]) -> None:
    assert "nope" in assert_error(admin.patch("/admin/services/nope", json={"timeout": 5}), 404)["error"]
    for bad in ({"name": "renamed"}, {"type": "vllm"}, {"timeout": 0}, {"timeout": 7200}, {"text_limit": 0},
                {"text_limit": 10**20}, {"context_length": 100}, {"url": ""}, {"url": "not a url"},
                {"url": "http://[::1"}, {"version_override": ""}, {"version_override": "x" * 101},
                {"api_key": ""}, {"context_length": 4096}, {"version_override": 35}):
        assert_error(admin.patch("/admin/services/ollama", json=bad), 400)
    assert_error(admin.patch("/admin/services/ollama", content=b"[]",
                             headers={"content-type": "application/json"}), 400)
    server, _ = vllm
    added = admin.post("/admin/services", json={"type": "vllm", "url": server.url, "name": "gpu"})
    assert added.status_code == 201
    for override in ("0.35.0", None):
        refused = assert_error(admin.patch("/admin/services/gpu", json={"version_override": override}), 400)
        assert "version_override" in refused["error"]
    assert "context_length" in assert_error(admin.patch("/admin/services/gpu", json={"context_length": 4096}),
                                            400)["error"]
    view = admin.get("/admin/services/ollama").json()
    assert view["timeout"] is None and view["version_override"] is None and view["text_limit"] == 65536
    assert admin.patch("/admin/services/ollama", json={"text_limit": 1000}).json()["text_limit"] == 1000
    cleared = admin.patch("/admin/services/ollama", json={"text_limit": None, "timeout": None})
    assert cleared.status_code == 200 and cleared.json()["text_limit"] == 65536  # null: the default again


def test_vllm_models_bad_input(admin: httpx.Client, vllm: tuple[EmulatorServer, VllmState]) -> None:
    server, _ = vllm
    added = admin.post("/admin/services", json={"type": "vllm", "url": server.url, "name": "gpu"})
    assert added.status_code == 201
    served = assert_error(admin.delete("/admin/services/gpu/models/Qwen/Qwen3-0.6B"), 400)
    assert "Refresh" in served["error"]
    missing = admin.post("/admin/services/gpu/models",
                         json={"model": "other/model", "capabilities": ["completion"]})
    assert "Qwen/Qwen3-0.6B" in assert_error(missing, 400)["error"]
    assert_error(admin.post("/admin/services/gpu/models", json={"model": "nimble"}), 400)  # an Ollama model
    server.stop()
    down = admin.post("/admin/services/gpu/models",
                      json={"model": "Qwen/Qwen3-0.6B", "capabilities": ["completion"]})
    assert "it did not answer as a vllm server" in assert_error(down, 400)["error"]


def test_service_routes_for_a_missing_service(admin: httpx.Client) -> None:
    for method, path, payload in (
            ("GET", "/admin/services/nope", None), ("DELETE", "/admin/services/nope", None),
            ("POST", "/admin/services/nope/refresh", None), ("GET", "/admin/services/nope/models", None),
            ("POST", "/admin/services/nope/models", {"model": "tev1"}),
            ("POST", "/admin/services/nope/models", {"model": "custom", "capabilities": ["decision"]}),
            ("DELETE", "/admin/services/nope/models/tev1", None)):
        assert "nope" in assert_error(admin.request(method, path, json=payload), 404)["error"]


def test_install_bad_input(admin: httpx.Client) -> None:
    for bad in ({}, {"model": ""}, {"model": 7}, {"model": "tev1", "force": True},
                {"model": "x", "capabilities": []}, {"model": "x", "capabilities": ["telepathy"]},
                {"model": "x", "capabilities": "decision"}, {"model": "x", "capabilities": [1]},
                {"model": "x", "capabilities": [None]}, {"model": "x" * 201},
                {"model": "tev1", "public_name": ""}, {"model": "tev1", "public_name": "x" * 201}):
        assert_error(admin.post("/admin/services/ollama/models", json=bad), 400)
    custom = assert_error(admin.post("/admin/services/ollama/models", json={"model": "my-own-model"}), 400)
    assert "capabilities" in custom["error"]
    telepathy = assert_error(admin.post("/admin/services/ollama/models",
                                        json={"model": "x", "capabilities": ["decision", "telepathy"]}), 400)
    assert "capabilities" in telepathy["error"]
    cloud_only = assert_error(admin.post("/admin/services/ollama/models", json={"model": "clef:27b"}), 400)
    assert "Ollama Cloud" in cloud_only["error"]
    assert_error(admin.post("/admin/services/ollama/models", json={"model": "nimble"}), 409, "conflict_error")
    assert admin.get("/admin/installs").json()["data"] == []


def test_long_names_are_refused_not_a_crash(admin: httpx.Client, stack: Stack) -> None:
    name = "a" * 196  # 203 characters with the ":latest" tag Ollama adds
    refused = admin.post("/admin/services/ollama/models", json={"model": name, "capabilities": ["completion"]})
    assert_error(refused, 400)
    assert not [r for r in stack.ollama_state.requests if r.path == "/api/pull"]


def test_uninstall_bad_input(admin: httpx.Client) -> None:
    assert "ghost" in assert_error(admin.delete("/admin/services/ollama/models/ghost"), 404)["error"]
    assert_error(admin.delete("/admin/services/ollama/models/ghost:7b"), 404)


def test_install_routes_bad_input(admin: httpx.Client) -> None:
    for path in ("/admin/installs/424242", f"/admin/installs/{HUGE_ID}"):
        assert_error(admin.get(path), 404)
        assert_error(admin.post(path + "/cancel"), 404)
    for path in ("/admin/installs/abc", "/admin/installs/1.5"):
        assert_error(admin.get(path), 400)
        assert_error(admin.post(path + "/cancel"), 400)


def test_cancel_a_finished_install(stack: Stack) -> None:
    state = OllamaState(models={}, pull_seconds=0.05)
    with EmulatorServer(make_ollama_app(state)) as server, stack.client("admin") as admin:
        added = admin.post("/admin/services", json={"type": "ollama", "url": server.url, "name": "own"})
        assert added.status_code == 201
        job = admin.post("/admin/services/own/models", json={"model": "tev1"}).json()
        deadline = time.monotonic() + 10
        while admin.get(f"/admin/installs/{job['id']}").json()["status"] == "running":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        refused = assert_error(admin.post(f"/admin/installs/{job['id']}/cancel"), 409, "conflict_error")
        assert "succeeded" in refused["error"]
        assert admin.get(f"/admin/installs/{job['id']}").json()["status"] == "succeeded"


def test_model_card_bad_input(admin: httpx.Client) -> None:
    for method in ("GET", "PATCH"):
        for model_id in ("987654", str(HUGE_ID), "-1"):
            payload = {"timeout": 5} if method == "PATCH" else None
            assert_error(admin.request(method, f"/admin/models/{model_id}", json=payload), 404)
        assert_error(admin.request(method, "/admin/models/nimble", json={} if method == "PATCH" else None), 400)
    assert_error(admin.post(f"/admin/models/{HUGE_ID}/test"), 404)
    model_id = nimble_id(admin)
    for bad in ({"public_name": ""}, {"public_name": "x" * 201}, {"public_name": 7}, {"timeout": 0},
                {"timeout": -2}, {"timeout": 3601}, {"timeout": "slow"}, {"capabilities": ["completion"]},
                {"backend_name": "other"}):
        assert_error(admin.patch(f"/admin/models/{model_id}", json=bad), 400)
    card = admin.get(f"/admin/models/{model_id}").json()
    assert (card["public_name"], card["timeout"]) == ("nimble", None)


def test_wrong_methods_and_unknown_routes(admin: httpx.Client) -> None:
    wrong = admin.put("/admin/services/ollama", json={})
    assert_error(wrong, 405, "method_not_allowed")
    assert set(wrong.headers["allow"].split(", ")) == {"GET", "PATCH", "DELETE"}
    assert_error(admin.get("/admin/installs/1/cancel"), 405, "method_not_allowed")
    assert_error(admin.post("/admin/services/ollama/reboot"), 404)


def test_a_service_url_with_credentials_is_refused(stack: Any) -> None:
    with stack.client("admin") as admin:
        response = admin.post("/admin/services", json={"type": "vllm", "url": "http://user:secret@127.0.0.1:9/"})
    error = assert_error(response, 400)
    assert "secret" not in response.text and "api_key" in error["error"]


UNSAFE_TEXT = [r"\ud800", r"\u0000", r"\u001b", r"\u007f", r"\u0085"]


def test_lone_surrogates_and_control_characters_are_400_and_write_nothing(admin: httpx.Client,
                                                                          stack: Stack) -> None:
    url, model_id = stack.ollama.url, nimble_id(admin)
    audited = audit_count(admin)
    fields = [  # <u> is where the unsafe text goes
        ("POST", "/admin/services", f'{{"type": "vllm<u>", "url": "{url}"}}'),
        ("POST", "/admin/services", f'{{"type": "ollama-external", "url": "{url}<u>"}}'),
        ("POST", "/admin/services", f'{{"type": "ollama-external", "url": "{url}", "name": "n<u>"}}'),
        ("PATCH", "/admin/services/ollama", f'{{"url": "{url}<u>"}}'),
        ("PATCH", "/admin/services/ollama", '{"version_override": "0.35.0<u>"}'),
        ("POST", "/admin/services/ollama/models", '{"model": "m<u>", "capabilities": ["completion"]}'),
        ("POST", "/admin/services/ollama/models", '{"model": "m", "capabilities": ["completion<u>"]}'),
        ("POST", "/admin/services/ollama/models", '{"model": "tev1", "public_name": "t<u>"}'),
        ("PATCH", f"/admin/models/{model_id}", '{"public_name": "n<u>"}'),
        ("POST", "/admin/mesh/peers", '{"url": "http://127.0.0.1:9/<u>"}'),
    ]
    for method, path, template in fields:
        for unsafe in UNSAFE_TEXT:
            response = admin.request(method, path, content=template.replace("<u>", unsafe).encode(),
                                     headers={"content-type": "application/json"})
            assert_error(response, 400)
    assert [s["name"] for s in admin.get("/admin/services").json()["data"]] == ["ollama"]
    assert admin.get(f"/admin/models/{model_id}").json()["public_name"] == "nimble"
    assert admin.get("/admin/services/ollama").json()["version_override"] is None
    assert admin.get("/admin/installs").json()["data"] == []
    assert audit_count(admin) == audited


def _answering(body: bytes) -> Callable[[web.Request], Awaitable[web.Response]]:
    """An aiohttp handler that answers ``body`` as JSON (aiohttp deprecates plain functions)."""
    async def handler(_request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")
    return handler


def test_an_answer_that_cannot_be_sent_leaves_the_change_uncommitted(stack: Stack) -> None:
    """An Ollama whose model has a capability with a lone surrogate in it: stored, that text
    could never be encoded again (every model list a 500). The answer fails, so must the change."""
    odd = web.Application()
    odd.router.add_get("/api/version", _answering(b'{"version": "0.35.0"}'))
    odd.router.add_get("/api/tags", _answering(b'{"models": [{"name": "odd:latest"}]}'))
    odd.router.add_post("/api/show", _answering(b'{"capabilities": ["completion\\ud800"]}'))
    with stack.client("admin") as admin:
        audited = audit_count(admin)
    with EmulatorServer(odd) as server, stack.client("admin") as admin:
        response = admin.post("/admin/services", json={"type": "ollama-external", "url": server.url, "name": "odd"})
    assert_error(response, 500, "internal_error")
    with stack.client("admin") as admin:  # a new connection: the server closes one after a 500
        assert_error(admin.get("/admin/services/odd"), 404)
        assert admin.get("/admin/models").status_code == 200
        assert audit_count(admin) == audited


BAD_API_KEYS = ["sekrit\r\nX-Injected: 1", "line\nbreak", "two words", "tab\tbed", "nul\x00", "del\x7f", "caf\u00e9"]


def test_an_api_key_that_is_no_bearer_token_is_a_400(admin: httpx.Client, stack: Stack,
                                                     vllm: tuple[EmulatorServer, VllmState]) -> None:
    """A line break in it once made every tenant request to the service a 500 (and could smuggle
    a header into each); Arbiter sends the key as `Authorization: Bearer <key>`."""
    audited = audit_count(admin)
    for bad in BAD_API_KEYS:
        for response in (admin.patch("/admin/services/ollama", json={"api_key": bad}),
                         admin.post("/admin/services", json={"type": "vllm", "url": vllm[0].url, "api_key": bad})):
            error = assert_error(response, 400)
            assert "api_key" in error["error"] and bad not in response.text
    assert admin.get("/admin/services/ollama").json()["has_credential"] is False
    assert [s["name"] for s in admin.get("/admin/services").json()["data"]] == ["ollama"]
    assert audit_count(admin) == audited
    with stack.client() as client:
        assert client.post("/v1/systemone", json=decision()).status_code == 200
    assert admin.patch("/admin/services/ollama", json={"api_key": "sk-Fine_key.1~"}).status_code == 200


def test_an_ollama_cloud_key_cannot_be_removed(stack: Stack, admin: httpx.Client) -> None:
    state = ollama_cloud_state("cloud-key")
    with EmulatorServer(make_ollama_app(state)) as server:
        added = admin.post("/admin/services", json={"type": "ollama-cloud", "url": server.url, "name": "cloud",
                                                    "api_key": "cloud-key"})
        assert added.status_code == 201, added.text
        before = audit_count(admin)
        refused = assert_error(admin.patch("/admin/services/cloud", json={"api_key": None}), 400)
        assert "api_key" in refused["error"]  # as adding one without a key is refused
        assert admin.get("/admin/services/cloud").json()["has_credential"] is True
        assert audit_count(admin) == before
        registered = admin.post("/admin/services/cloud/models", json={"model": "clef:27b"})
        assert registered.status_code == 201, registered.text
        with stack.client() as client:
            assert client.post("/v1/systemone", json=decision("clef:27b")).status_code == 200
