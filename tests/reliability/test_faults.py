"""The fault suite: a backend that misbehaves in every way a real one does. For each, the
client gets the right status within the timeout, Arbiter stays healthy and serves the next
request, and nothing leaks (connections, tasks) once the suite is over."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.support import Gateway, Stack, assert_error, decision

TIMEOUT = 1.0

FAULTS: dict[str, tuple[Callable[[Any], None], int]] = {
    "refuses connections": (lambda s: s.extra["server"].stop(), 502),
    "accepts and never answers": (lambda s: setattr(s.ollama_state.faults, "hang", True), 504),
    "resets mid-answer": (lambda s: setattr(s.ollama_state.faults, "reset_mid_body", True), 502),
    "drops the connection": (lambda s: setattr(s.ollama_state.faults, "drop_connection", True), 502),
    "answers non-JSON": (lambda s: setattr(s.ollama_state.faults, "non_json", True), 502),
    "answers 100 MB": (lambda s: setattr(s.ollama_state.faults, "huge_body_bytes", 100 * 1024 * 1024), 502),
    "answers byte by byte, too slowly": (lambda s: setattr(s.ollama_state.faults, "trickle_delay", 0.05), 504),
    "answers late": (lambda s: setattr(s.ollama_state.faults, "latency", 3.0), 504),
    "answers its own 503": (lambda s: setattr(s.ollama_state.faults, "status", 503), 503),
}


@pytest.fixture
def faulty(stack: Stack, gateway_factory: Callable[..., Gateway]) -> Stack:
    stack.gateway = gateway_factory(backend_timeout=TIMEOUT, replica_backoff=0.01)
    stack.extra["server"] = stack.ollama
    return stack


def in_gateway(gateway: Gateway, work: Any) -> Any:
    loop = gateway.app.components.loop
    assert loop is not None
    return asyncio.run_coroutine_threadsafe(work(), loop).result(timeout=10)


def leaks(gateway: Gateway) -> tuple[int, int]:
    """(connections checked out of the backend pools, tasks) inside the running gateway."""
    async def count() -> tuple[int, int]:
        acquired = 0
        for entry in gateway.app.components.registry.entries():
            for replica in entry.replicas:
                session = getattr(replica.backend, "_session", None)
                if session is not None and not session.closed:
                    acquired += len(session.connector._acquired)
                pool = getattr(replica.backend, "_pool", None)  # the lean client's (infra_adapters/h1.py)
                if pool is not None:
                    acquired += pool.busy
        return acquired, len(asyncio.all_tasks())
    return in_gateway(gateway, count)  # type: ignore[no-any-return]


def settled(gateway: Gateway, baseline_tasks: int) -> tuple[int, int]:
    """``leaks()`` once connections are back and tasks are down to ``baseline_tasks``, or after 10 s.
    A periodic flush of usage or key touches may be under way (a shielded task of its own)."""
    deadline = time.monotonic() + 10
    while True:
        acquired, tasks = leaks(gateway)
        if (acquired == 0 and tasks <= baseline_tasks) or time.monotonic() > deadline:
            return acquired, tasks
        time.sleep(0.05)


@pytest.mark.parametrize("fault", FAULTS)
def test_each_fault_gets_the_right_status_in_time_and_the_next_request_is_served(faulty: Stack, fault: str) -> None:
    with faulty.client() as client:
        assert client.post("/v1/systemone", json=decision()).status_code == 200
        _, baseline_tasks = leaks(faulty.gateway)
        inject, status = FAULTS[fault]
        inject(faulty)
        started = time.monotonic()
        response = client.post("/v1/systemone", json=decision())
        elapsed = time.monotonic() - started
        if fault == "answers its own 503":
            assert response.status_code == 503
        else:
            assert_error(response, status)
        assert elapsed < TIMEOUT + 1.5, f"{fault}: answered after {elapsed:.1f}s"
        faulty.ollama_state.faults.reset()
        if not faulty.extra["server"].running:
            faulty.extra["server"].start()
        time.sleep(0.05)  # the replica's back-off (10 ms here) runs out
        assert client.post("/v1/systemone", json=decision()).status_code == 200
        assert client.get("/healthz").status_code == 200
    acquired, tasks = settled(faulty.gateway, baseline_tasks)
    assert acquired == 0, f"{fault}: {acquired} backend connections still checked out"
    assert tasks <= baseline_tasks, f"{fault}: {tasks - baseline_tasks} tasks left behind"


def test_many_faulty_requests_in_a_row_leak_nothing(faulty: Stack) -> None:
    with faulty.client() as client:
        assert client.post("/v1/systemone", json=decision()).status_code == 200
        _, baseline_tasks = leaks(faulty.gateway)
        for fault in ("reset_mid_body", "non_json", "drop_connection"):
            setattr(faulty.ollama_state.faults, fault, True)
            for _ in range(20):
                assert client.post("/v1/systemone", json=decision()).status_code == 502
                time.sleep(0.015)
            faulty.ollama_state.faults.reset()
        time.sleep(0.05)
        assert client.post("/v1/systemone", json=decision()).status_code == 200
    acquired, tasks = settled(faulty.gateway, baseline_tasks)
    assert acquired == 0 and tasks <= baseline_tasks
