"""1,000 concurrent client connections against a real `arbiter serve`: every request is
answered (or shed with 503 and Retry-After at the configured cap), and it recovers after."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest

from infra_adapters.emulators.ollama import OllamaState, make_ollama_app
from infra_adapters.emulators.server import EmulatorServer
from tests.e2e.conftest import ARBITER, environment, run, wait_ready
from tests.support import free_port

BODY = {"model": "nimble", "state": "s", "questions": {"q": {"type": "noul"}}}
CONNECTIONS = 1000


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Any]:
    state = OllamaState()
    state.faults.latency = 0.3  # requests stay in flight: the load is real concurrency
    emulator = EmulatorServer(make_ollama_app(state)).start()
    env = environment(f"sqlite:///{tmp_path / 'arbiter.db'}")
    run(["migrate"], env)
    run(["service", "add", "--type", "ollama-external", "--url", emulator.url], env)
    run(["project", "create", "load"], env)
    key = run(["key", "create", "--project", "load"], env).stdout.strip().splitlines()[-1]
    processes: list[subprocess.Popen[bytes]] = []

    def serve(**settings: str) -> str:
        port = free_port()
        extra = {f"ARBITER_{k.upper()}": v for k, v in settings.items()}
        process = subprocess.Popen([ARBITER, "serve", "--port", str(port)], env={**env, **extra},
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        processes.append(process)
        url = f"http://127.0.0.1:{port}"
        wait_ready(f"{url}/healthz", process)
        return url

    yield serve, key
    for process in processes:
        process.terminate()
        process.wait(timeout=30)
    emulator.stop()


async def flood(url: str, key: str) -> list[tuple[int, str | None]]:
    connector = aiohttp.TCPConnector(limit=CONNECTIONS, force_close=True)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout,
                                     headers={"Authorization": f"Bearer {key}"}) as session:
        async def one() -> tuple[int, str | None]:
            async with session.post(f"{url}/v1/systemone", json=BODY) as response:
                await response.read()
                return response.status, response.headers.get("Retry-After")
        return await asyncio.gather(*(one() for _ in range(CONNECTIONS)))


def test_every_one_of_a_thousand_concurrent_requests_is_answered(deployment: Any) -> None:
    serve, key = deployment
    url = serve()
    results = asyncio.run(flood(url, key))
    assert [status for status, _ in results] == [200] * CONNECTIONS
    assert httpx.post(f"{url}/v1/systemone", json=BODY, headers={"Authorization": f"Bearer {key}"}).status_code == 200


def test_past_the_cap_load_is_shed_with_503_and_it_recovers(deployment: Any) -> None:
    serve, key = deployment
    url = serve(max_concurrency="100")
    results = asyncio.run(flood(url, key))
    statuses = [status for status, _ in results]
    assert set(statuses) <= {200, 503}
    assert statuses.count(200) >= 100 and statuses.count(503) > 0
    assert all(retry == "1" for status, retry in results if status == 503)
    with httpx.Client(headers={"Authorization": f"Bearer {key}"}) as client:
        assert client.post(f"{url}/v1/systemone", json=BODY).status_code == 200
        assert client.get(f"{url}/healthz").status_code == 200
