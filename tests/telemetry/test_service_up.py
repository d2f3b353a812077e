"""arbiter_service_up{service}: 1 while a service answers its reads, 0 once it does not, gone
once removed; made from the state the registry holds, with no call to any backend per scrape."""

from __future__ import annotations

from collections.abc import Callable

from tests.support import Gateway, Stack, synced, wait_for
from tests.telemetry.test_metrics import scrape


def service_up(stack: Stack) -> dict[str, float]:
    return {dict(labels)["service"]: value for (name, labels), value in scrape(stack).items()
            if name == "arbiter_service_up"}


def test_a_service_is_up_then_down_then_gone(stack: Stack) -> None:
    assert service_up(stack) == {"ollama": 1.0}
    stack.ollama.stop()
    with stack.client("admin") as admin:  # a Refresh reads it (as the scheduled sync does): it is away
        assert admin.post("/admin/services/ollama/refresh").json()["reachable"] is False
    assert service_up(stack) == {"ollama": 0.0}
    with stack.client("admin") as admin:
        assert admin.delete("/admin/services/ollama").status_code == 204
    assert service_up(stack) == {}


def test_every_replica_sees_a_read_made_by_another(stack: Stack, gateway_factory: Callable[..., Gateway]) -> None:
    """The state is the database's: a second replica learns a service is down at its next reload
    (ARBITER_REGISTRY_REFRESH_INTERVAL, 0.2 s in the tests) without reading the service itself."""
    other = synced(gateway_factory())  # its own start-up read is done: what follows, it only reloads
    stack.ollama.stop()
    with stack.client("admin") as admin:
        assert admin.post("/admin/services/ollama/refresh").json()["reachable"] is False

    def seen_down() -> bool:
        with other.client(stack.admin_key) as admin:
            text = admin.get("/metrics").text
        return 'arbiter_service_up{service="ollama"} 0.0' in text
    wait_for(seen_down)


def test_a_scrape_calls_no_backend(stack: Stack) -> None:
    before = len(stack.ollama_state.requests)
    for _ in range(3):
        assert service_up(stack) == {"ollama": 1.0}
    assert len(stack.ollama_state.requests) == before
