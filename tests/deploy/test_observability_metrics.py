"""Every metric the dashboard and the alert rules read is one the app really exports: a running
Arbiter (with Redis, a backend and a decision served) is scraped, and each name the kit's PromQL
uses must be among the scrape's (a family with no series yet still names itself)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from app.db.session import Database
from infra_adapters.emulators.ollama import OllamaState
from infra_adapters.emulators.server import EmulatorServer
from tests.deploy.observability import (
    dashboard,
    dashboard_queries,
    exported_names,
    metric_names,
    rules,
)
from tests.support import Gateway, Stack, decision, redis_url, synced


def kit_metric_names() -> dict[str, set[str]]:
    """Each metric name the kit uses, with where."""
    used: dict[str, set[str]] = {}
    for where, expr in dashboard_queries(dashboard()):
        for name in metric_names(expr):
            used.setdefault(name, set()).add(f"grafana-dashboard.json {where}")
    for rule in rules():
        for name in metric_names(rule["expr"]):
            used.setdefault(name, set()).add(f"alerts.yaml {rule['alert']}")
    return used


def test_every_metric_the_kit_uses_is_exported(db: Database, ollama: tuple[EmulatorServer, OllamaState],
                                                gateway_factory: Callable[..., Gateway]) -> None:
    server, _ = ollama
    stack = Stack.provision(db, ollama_url=server.url)
    stack.gateway = synced(gateway_factory(redis_url=redis_url(0)))
    with stack.client() as client:
        assert client.post("/v1/systemone", json=decision()).status_code == 200
    with stack.client("admin") as admin:
        scrape = admin.get("/metrics")
    assert scrape.status_code == 200, scrape.text
    exported = exported_names(text_string_to_metric_families(scrape.text))
    used = kit_metric_names()
    assert len(used) >= 15, sorted(used)
    missing = {name: sorted(where) for name, where in used.items() if name not in exported}
    assert not missing, f"used by deploy/observability/ but not exported by /metrics: {missing}"
