"""Several services serving one public name: fewest in flight, back-off, one retry."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from app.db.session import Database
from infra_adapters.emulators.ollama import OllamaState, make_ollama_app
from infra_adapters.emulators.server import EmulatorServer
from tests.support import Gateway, Stack, add_service, assert_error, decision, synced


@pytest.fixture
def two_replicas(db: Database, gateway_factory: Callable[..., Gateway]) -> Iterator[Stack]:
    states = [OllamaState(), OllamaState()]
    servers = [EmulatorServer(make_ollama_app(s)).start() for s in states]
    built = Stack.provision(db, ollama_url=servers[0].url)
    add_service(db, type="ollama-external", url=servers[1].url, name="ollama-2")
    built.gateway = synced(gateway_factory(replica_backoff=30))
    built.extra.update(servers=servers, states=states)
    yield built
    for server in servers:
        server.stop()


def served_by(states: list[OllamaState]) -> list[int]:
    return [sum(r.path == "/v1/systemone" for r in s.requests) for s in states]


def test_load_is_spread_over_replicas(two_replicas: Stack) -> None:
    states = two_replicas.extra["states"]
    for state in states:
        state.faults.latency = 0.2  # keep requests in flight so the counts matter
    with two_replicas.client() as client, ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(lambda _: client.post("/v1/systemone", json=decision()).status_code, range(16)))
    assert codes == [200] * 16
    first, second = served_by(states)
    assert first >= 4 and second >= 4, (first, second)


def test_a_replica_stopped_mid_run_loses_no_request(two_replicas: Stack) -> None:
    servers, states = two_replicas.extra["servers"], two_replicas.extra["states"]

    def send(i: int, client: Any) -> int:
        if i == 10:
            servers[0].stop()
        return int(client.post("/v1/systemone", json=decision()).status_code)

    with two_replicas.client() as client:
        codes = [send(i, client) for i in range(40)]
    assert codes == [200] * 40
    before = served_by(states)
    with two_replicas.client() as client:
        assert all(client.post("/v1/systemone", json=decision()).status_code == 200 for _ in range(5))
    assert served_by(states)[0] == before[0]  # backed off: not even tried


def test_a_4xx_does_not_take_a_replica_out(two_replicas: Stack) -> None:
    states = two_replicas.extra["states"]
    bad = decision(questions={"q": {"type": "choice", "criteria": {"only": None}}})  # Ollama's own 400
    with two_replicas.client() as client:
        for _ in range(6):
            assert client.post("/v1/systemone", json=bad).status_code == 400
    assert all(n >= 2 for n in served_by(states))


def test_a_backend_503_is_retried_elsewhere_and_passed_through_when_alone(two_replicas: Stack) -> None:
    states = two_replicas.extra["states"]
    states[0].faults.status = 503
    states[0].faults.body = b'{"error":"overloaded"}'
    with two_replicas.client() as client:
        assert all(client.post("/v1/systemone", json=decision()).status_code == 200 for _ in range(6))
        states[1].faults.status = 503
        states[1].faults.body = b'{"error":"overloaded too"}'
        response = client.post("/v1/systemone", json=decision())
    assert response.status_code == 503 and response.content == b'{"error":"overloaded too"}'


def test_every_replica_out_is_503_with_retry_after(two_replicas: Stack) -> None:
    for server in two_replicas.extra["servers"]:
        server.stop()
    with two_replicas.client() as client:
        assert_error(client.post("/v1/systemone", json=decision()), 502)
        response = client.post("/v1/systemone", json=decision())
    assert_error(response, 503)
    assert int(response.headers["retry-after"]) >= 1


def test_a_replica_that_cannot_answer_decisions_fails_over(two_replicas: Stack) -> None:
    """SPEC §1: 405 only when every holder of the model cannot answer decisions."""
    states = two_replicas.extra["states"]
    states[0].version = "0.34.9"  # downgraded after install: its /v1/systemone is gone
    with two_replicas.client() as client:
        assert all(client.post("/v1/systemone", json=decision()).status_code == 200 for _ in range(6))
        states[1].version = "0.34.9"
        for _ in range(3):  # not backed off: a steady 405, never a 503
            assert_error(client.post("/v1/systemone", json=decision()), 405, "unsupported_error")


def test_in_flight_counts_survive_registry_reloads(two_replicas: Stack) -> None:
    """Replicas are updated in place on reload, so a request in flight during one ends at zero."""
    states = two_replicas.extra["states"]
    for state in states:
        state.faults.latency = 0.3
    gateway = two_replicas.gateway
    loop = gateway.app.components.loop
    import asyncio

    with two_replicas.client() as client, ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(client.post, "/v1/systemone", json=decision()) for _ in range(6)]
        deadline = time.monotonic() + 10  # requests in flight (a fixed pause may be too short on a loaded host)
        while not any(r.in_flight for r in gateway.app.components.registry.get("nimble").replicas):
            assert time.monotonic() < deadline, "no request reached the backends"
            time.sleep(0.01)
        asyncio.run_coroutine_threadsafe(gateway.app.components.registry.reload(), loop).result(5)
        assert all(f.result().status_code == 200 for f in futures)
    replicas = gateway.app.components.registry.get("nimble").replicas
    assert [r.in_flight for r in replicas] == [0, 0]
