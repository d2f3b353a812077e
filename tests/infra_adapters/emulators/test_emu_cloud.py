"""The Ollama Cloud stand-in: bearer on every path, its own models, no pulls."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from infra_adapters.emulators import ollama_cloud_state
from infra_adapters.emulators.ollama import make_ollama_app
from infra_adapters.emulators.server import EmulatorServer

from .streams import ndjson

KEY = "cloud-secret"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def cloud() -> Iterator[httpx.Client]:
    state = ollama_cloud_state(KEY)
    state.pull_seconds = 0.0
    with (
        EmulatorServer(make_ollama_app(state)) as server,
        httpx.Client(base_url=server.url, timeout=3.0) as client,
    ):
        yield client


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/"),
        ("GET", "/api/version"),
        ("GET", "/api/tags"),
        ("POST", "/api/show"),
        ("POST", "/api/chat"),
        ("POST", "/api/pull"),
        ("POST", "/v1/systemone"),
        ("POST", "/v1/chat/completions"),
    ],
)
def test_bearer_required_on_every_path(cloud: httpx.Client, method: str, path: str) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        resp = cloud.request(method, path, json={}, headers=headers)
        assert (resp.status_code, resp.json()) == (401, {"error": "unauthorized"})


def test_cloud_serves_its_models(cloud: httpx.Client) -> None:
    assert cloud.get("/api/version", headers=AUTH).json() == {"version": "0.35.2"}
    names = [m["name"] for m in cloud.get("/api/tags", headers=AUTH).json()["models"]]
    assert names == ["clef:27b", "gpt-oss:120b"]
    show = cloud.post("/api/show", json={"model": "gpt-oss:120b"}, headers=AUTH).json()
    assert show["capabilities"] == ["completion", "tools", "thinking"]
    assert show["details"]["parameter_size"] == "120B"
    decision = {"model": "clef:27b", "state": "s", "questions": {"q": {"type": "noul"}}}
    assert cloud.post("/v1/systemone", json=decision, headers=AUTH).status_code == 200
    chat = {"model": "gpt-oss:120b", "messages": [{"role": "user", "content": "hi"}]}
    reply = cloud.post("/api/chat", json={**chat, "stream": False, "think": True}, headers=AUTH)
    assert reply.json()["message"]["content"] == "Echo: hi"


def test_cloud_pulls_nothing_new(cloud: httpx.Client) -> None:
    lines = ndjson(cloud.post("/api/pull", json={"model": "nimble"}, headers=AUTH).text)
    assert lines[-1] == {"error": "pull model manifest: file does not exist"}
    names = [m["name"] for m in cloud.get("/api/tags", headers=AUTH).json()["models"]]
    assert names == ["clef:27b", "gpt-oss:120b"]
