"""Arbiter's Ollama adapter against the emulator, which answers as Ollama's gin router does."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from infra_adapters.base import CallOptions, Reply
from infra_adapters.emulators.ollama import OllamaState, make_ollama_app
from infra_adapters.emulators.server import EmulatorServer
from infra_adapters.ollama import OllamaBackend


@pytest.fixture
def ollama() -> Iterator[tuple[EmulatorServer, OllamaState]]:
    state = OllamaState()
    with EmulatorServer(make_ollama_app(state)) as server:
        yield server, state


def test_a_model_whose_show_fails_is_listed_as_unreadable(ollama: tuple[EmulatorServer, OllamaState]) -> None:
    server, state = ollama
    state.show_errors["clef"] = "failed to read gguf: unexpected EOF"  # Ollama's ShowHandler: a 500
    url = server.url.replace("http://", "http://admin:s3cret@")  # a URL that carries a secret
    models = {m.name: m for m in OllamaBackend(url).list_models()}
    assert list(models) == ["nimble:latest", "clef:latest", "llama3.2:latest"]
    assert models["nimble:latest"].capabilities == {"decision"} and models["nimble:latest"].unreadable is None
    clef = models["clef:latest"]
    assert clef.capabilities == frozenset()
    assert clef.unreadable == "cannot read its capabilities: /api/show answered HTTP 500"
    assert clef.details["format"] == "gguf"  # what /api/tags said of it is kept


def _decision(model: str) -> dict[str, Any]:
    return {"model": model, "state": "My card was charged twice.",
            "questions": {"urgent": {"type": "noul", "instructions": "Reply within the hour?"}}}


def _systemone(url: str, model: str) -> Reply:
    async def call() -> Reply:
        backend = OllamaBackend(url)
        try:
            return await backend.systemone(_decision(model), CallOptions(timeout=5.0, max_reply_bytes=1 << 20))
        finally:
            await backend.aclose()

    return asyncio.run(call())


def test_no_decision_route_is_told_from_a_missing_model(ollama: tuple[EmulatorServer, OllamaState]) -> None:
    """gin answers a route it does not have with a plain-text 404 whatever the method (a 405
    only where another method has the path, and no Ollama has /v1/systemone for another method):
    a downgraded Ollama is still "no decisions here", and a missing model is not."""
    server, state = ollama
    backend = OllamaBackend(server.url)
    state.version = "0.34.9"  # downgraded: no /v1/systemone
    downgraded = _systemone(server.url, "nimble")
    assert (downgraded.status, downgraded.content_type, downgraded.body) == (404, "text/plain",
                                                                             b"404 page not found")
    assert backend.decisions_unsupported(downgraded)
    state.version = "0.35.0"
    missing = _systemone(server.url, "nope")
    assert missing.status == 404 and (missing.content_type or "").startswith("application/json")
    assert not backend.decisions_unsupported(missing)
