"""Arbiter's Ollama adapter against the emulator, which answers as Ollama's gin router does."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web

from infra_adapters.admin import AdminClient
from infra_adapters.base import BackendAuthRejected, CallOptions, Reply
from infra_adapters.emulators.ollama import OllamaState, make_ollama_app
from infra_adapters.emulators.server import EmulatorServer
from infra_adapters.ollama import SHOW_CALLS, OllamaBackend


@pytest.fixture
def ollama() -> Iterator[tuple[EmulatorServer, OllamaState]]:
    state = OllamaState()
    with EmulatorServer(make_ollama_app(state)) as server:
        yield server, state


def test_a_model_whose_show_fails_is_listed_as_unreadable(ollama: tuple[EmulatorServer, OllamaState]) -> None:
    server, state = ollama
    state.show_errors["clef"] = "failed to read gguf: unexpected EOF"  # Ollama's ShowHandler: a 500
    url = server.url.replace("http://", "http://admin:s3cret@")  # a URL that carries a secret
    models = {m.name: m for m in asyncio.run(OllamaBackend(url).list_models())}
    assert list(models) == ["nimble:latest", "clef:latest", "llama3.2:latest"]
    assert models["nimble:latest"].capabilities == {"decision"} and models["nimble:latest"].unreadable is None
    clef = models["clef:latest"]
    assert clef.capabilities == frozenset()
    assert clef.unreadable == "cannot read its capabilities: /api/show answered HTTP 500"
    assert clef.details["format"] == "gguf"  # what /api/tags said of it is kept


def _slow_show(app: web.Application, delays: dict[str, float]) -> dict[str, int]:
    """``/api/show`` of each model in ``delays`` waits that long; counts the calls at once."""
    counts = {"now": 0, "most": 0}

    @web.middleware
    async def slow(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path != "/api/show":
            return await handler(request)
        name = (await request.json())["model"].removesuffix(":latest")
        counts["now"] += 1
        counts["most"] = max(counts["most"], counts["now"])
        try:
            await asyncio.sleep(delays.get(name, 0.0))
            if name == "refused":
                return web.json_response({"error": "unauthorized"}, status=401)
            return await handler(request)
        finally:
            counts["now"] -= 1

    app.middlewares.append(slow)
    return counts


async def _listed(url: str) -> list[Any]:
    async with AdminClient() as admin:
        return await OllamaBackend(url, admin=admin).list_models()


def test_the_models_are_described_a_few_at_a_time_in_the_order_listed() -> None:
    """/api/show runs SHOW_CALLS at once, not one by one nor all at once; the later calls answer
    first here, and the list is still in /api/tags order."""
    names = [f"m{i}" for i in range(3 * SHOW_CALLS)]
    state = OllamaState(models={name: ["decision"] for name in names})
    app = make_ollama_app(state)
    counts = _slow_show(app, {name: 0.05 * (len(names) - i) for i, name in enumerate(names)})
    with EmulatorServer(app) as server:
        models = asyncio.run(_listed(server.url))
    assert [m.name for m in models] == [f"{name}:latest" for name in names]
    assert all(m.capabilities == {"decision"} and m.unreadable is None for m in models)
    assert counts["most"] == SHOW_CALLS


def test_a_refused_key_stops_the_listing_and_the_calls_under_way() -> None:
    """About the service's key, not one model: raised as itself (not in a group of errors), at
    once, the other /api/show calls given up rather than waited for."""
    state = OllamaState(models={"slow-a": ["decision"], "refused": ["decision"], "slow-b": ["decision"]})
    app = make_ollama_app(state)
    _slow_show(app, {"slow-a": 30.0, "refused": 0.2, "slow-b": 30.0})
    started = time.monotonic()
    with EmulatorServer(app) as server, pytest.raises(BackendAuthRejected, match="/api/show refused"):
        asyncio.run(_listed(server.url))
    assert time.monotonic() - started < 5.0


def test_a_cancelled_listing_gives_up_its_calls_and_is_cancelled() -> None:
    """The shutdown cancels a sync listing an Ollama: the cancel is raised (not a BackendError that
    would have the service written down as unreachable), and the /api/show calls under way end."""
    state = OllamaState(models={"slow-a": ["decision"], "slow-b": ["decision"]})
    app = make_ollama_app(state)
    counts = _slow_show(app, {"slow-a": 30.0, "slow-b": 30.0})

    async def walk(url: str) -> bool:
        listing = asyncio.ensure_future(_listed(url))
        while counts["now"] < 2:
            await asyncio.sleep(0.01)
        listing.cancel()
        try:
            await listing
        except asyncio.CancelledError:
            return True
        return False

    started = time.monotonic()
    with EmulatorServer(app) as server:
        assert asyncio.run(walk(server.url))
        deadline = time.monotonic() + 5
        while counts["now"] and time.monotonic() < deadline:  # the server sees the calls' connections close
            time.sleep(0.01)
    assert counts["now"] == 0 and time.monotonic() - started < 5.0


def test_delete_says_whether_the_model_was_there(ollama: tuple[EmulatorServer, OllamaState]) -> None:
    server, state = ollama

    async def delete(name: str) -> bool:
        return await OllamaBackend(server.url).delete(name)

    assert asyncio.run(delete("clef")) is True
    assert state.find_model("clef") is None
    assert asyncio.run(delete("clef")) is False  # Ollama's 404: it did not have it


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
