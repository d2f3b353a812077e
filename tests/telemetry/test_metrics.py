"""GET /metrics after known requests: token histograms match what the backend reported."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.db.session import Database
from infra_adapters.emulators.ollama import OllamaState, make_ollama_app
from infra_adapters.emulators.server import EmulatorServer
from tests.support import Stack, add_service, assert_error, decision, free_port
from tests.ui.conftest import ui_sign_in


def scrape(stack: Stack, key: str = "admin") -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with stack.client(key) as client:
        response = client.get("/metrics")
    assert response.status_code == 200, response.text
    return samples(response.text)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def token_labels(token_type: str, project: str = "acme", model: str = "nimble") -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"gen_ai_operation_name": "decision", "gen_ai_provider_name": "ollama",
                         "gen_ai_token_type": token_type, "gen_ai_request_model": model,
                         "project": project}.items()))


def test_token_usage_histogram_matches_the_backends_usage(stack: Stack) -> None:
    usages: list[dict[str, int]] = []
    with stack.client() as client:
        for state in ("short", "a somewhat longer state " * 20, {"ticket": "json state"}):
            answer = client.post("/v1/systemone", json=decision(state=state))
            assert answer.status_code == 200
            usages.append(answer.json()["usage"])
        # Failures add no token observations.
        assert client.post("/v1/systemone", json=decision("ghost")).status_code == 404
        assert client.post("/v1/systemone", json=decision(state=5)).status_code == 400
    metrics = scrape(stack)
    for kind in ("input", "output"):
        labels = token_labels(kind)
        assert metrics[("gen_ai_client_token_usage_count", labels)] == 3
        assert metrics[("gen_ai_client_token_usage_sum", labels)] == sum(u[f"{kind}_tokens"] for u in usages)
        bucket = tuple(sorted((*labels, ("le", "6.7108864e+07"))))
        assert metrics[("gen_ai_client_token_usage_bucket", bucket)] == 3
    names = {name for name, _ in metrics}
    assert "gen_ai_client_operation_duration_seconds_count" in names
    assert "arbiter_gateway_overhead_seconds_count" in names
    assert not any("key" in dict(labels) for _, labels in metrics)  # never a per-key label
    requests = {dict(labels)["status"]: value for (name, labels), value in metrics.items()
                if name == "arbiter_http_requests_total" and dict(labels)["route"] == "/v1/systemone"}
    assert requests == {"200": 3, "404": 1, "400": 1}


def test_web_ui_requests_are_counted_under_their_full_templates(stack: Stack) -> None:
    """The UI's pages sit in routers included in /ui: their label is the template they are
    served at, never the template within their own router (that would be another page's
    address, /services/{service_id} for /ui/services/1) nor a raw path."""
    with stack.client("admin") as admin:
        service_id = admin.get("/admin/services").json()["data"][0]["id"]
    ui = ui_sign_in(stack.gateway.url, stack.admin_key)  # GET and POST /ui/sign-in
    for path, status in ((f"/ui/services/{service_id}", 200), ("/ui/static/arbiter.css", 200),
                         ("/ui/api/installs/999", 404), ("/ui/no/such/page", 404), ("/ui", 303)):
        assert ui.get(path).status_code == status, path
    ui.close()
    counted = {(dict(labels)["method"], dict(labels)["route"], dict(labels)["status"]): value
               for (name, labels), value in scrape(stack).items()
               if name == "arbiter_http_requests_total" and dict(labels)["route"] != "/admin/services"}
    assert counted == {("GET", "/ui/sign-in", "200"): 1, ("POST", "/ui/sign-in", "303"): 1,
                       ("GET", "/ui/services/{service_id}", "200"): 1, ("GET", "/ui/static/{name}", "200"): 1,
                       ("GET", "/ui/api/installs/{install_id}", "404"): 1, ("GET", "/ui/{rest:path}", "404"): 1,
                       ("GET", "/ui", "303"): 1}


def overhead(metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> tuple[float, float]:
    """(count, sum) of the decisions' gateway overhead histogram."""
    labels = (("gen_ai_operation_name", "decision"),)
    return (metrics.get(("arbiter_gateway_overhead_seconds_count", labels), 0),
            metrics.get(("arbiter_gateway_overhead_seconds_sum", labels), 0))


def test_a_decision_whose_backend_failed_has_its_overhead_observed(stack: Stack, gateway_factory: Any) -> None:
    """A timeout (504) and a refused connection (502), on a request and on the Test action: each
    reached a backend, so each is an overhead observation, and the second it waited is not in it."""
    gateway = gateway_factory(backend_timeout=1.0, replica_backoff=0.01)
    stack.ollama_state.faults.hang = True
    with gateway.client(stack.project_key) as client:
        assert_error(client.post("/v1/systemone", json=decision()), 504)
        assert_error(client.post("/v1/systemone", json=decision("ghost")), 404)  # never reached a backend
    with gateway.client(stack.admin_key) as admin:
        model_id = next(m["id"] for m in admin.get("/admin/models").json()["data"] if m["public_name"] == "nimble")
        assert admin.post(f"/admin/models/{model_id}/test").json()["status"] == 504
        stack.ollama.stop()
        time.sleep(0.05)  # the Test's 504 backed the replica off for 0.01 s: past that, it is tried again
        assert_error(gateway.client(stack.project_key).post("/v1/systemone", json=decision()), 502)
        metrics = samples(admin.get("/metrics").text)
    count, seconds = overhead(metrics)
    assert count == 3
    assert seconds < 0.5  # two 1 s waits on a hanging backend are not the gateway's own time


@pytest.fixture
def two_replicas(db: Database, stack: Stack) -> Iterator[list[OllamaState]]:
    """A second emulated Ollama serving the stack's models, as a second service (for gateways
    started after it)."""
    state = OllamaState()
    with EmulatorServer(make_ollama_app(state)) as server:
        add_service(db, type="ollama-external", url=server.url, name="ollama-2")
        yield [stack.ollama_state, state]


def test_the_wait_on_a_replica_that_failed_before_another_answered_is_not_overhead(
        stack: Stack, two_replicas: list[OllamaState], gateway_factory: Any) -> None:
    slow, healthy = two_replicas
    slow.faults.latency, slow.faults.status = 1.0, 503  # a 503 after a second: retried on the other
    gateway = gateway_factory(replica_backoff=0.01)
    with gateway.client(stack.project_key) as client:
        assert [client.post("/v1/systemone", json=decision()).status_code for _ in range(3)] == [200] * 3
    tried = [sum(r.path == "/v1/systemone" for r in state.requests) for state in (slow, healthy)]
    assert tried[0] >= 1 and tried[1] == 3, tried  # ties take turns: some request tried the slow one first
    with gateway.client(stack.admin_key) as admin:
        count, seconds = overhead(samples(admin.get("/metrics").text))
    assert count == 3 and seconds < 0.5


def test_token_buckets_follow_the_genai_conventions(stack: Stack) -> None:
    with stack.client() as client:
        assert client.post("/v1/systemone", json=decision()).status_code == 200
    buckets = sorted(float(dict(labels)["le"]) for (name, labels) in scrape(stack)
                     if name == "gen_ai_client_token_usage_bucket" and dict(labels)["gen_ai_token_type"] == "input")
    assert buckets[:-1] == [float(4**n) for n in range(14)] and buckets[-1] == float("inf")


def test_the_test_action_is_labelled_test_and_not_billed(stack: Stack) -> None:
    with stack.client("admin") as admin:
        model_id = next(m["id"] for m in admin.get("/admin/models").json()["data"] if m["public_name"] == "nimble")
        assert admin.post(f"/admin/models/{model_id}/test").json()["ok"] is True
    metrics = scrape(stack)
    assert metrics[("gen_ai_client_token_usage_count", token_labels("input", project="_test"))] == 1
    with stack.client("admin") as admin:
        assert admin.get("/admin/usage").json()["data"] == []


def test_metrics_need_their_credential(stack: Stack, gateway_factory: Any) -> None:
    assert_error(stack.client(None).get("/metrics"), 401)
    assert_error(stack.client().get("/metrics"), 401)  # a project key is not enough
    token = "scrape-me-with-this-metrics-token-0123456789"
    guarded = gateway_factory(metrics_token=token)
    with guarded.client(token) as client:
        assert client.get("/metrics").status_code == 200
    with guarded.client(stack.admin_key) as client:
        assert_error(client.get("/metrics"), 401)


def test_redis_up_is_absent_without_redis(stack: Stack) -> None:
    with stack.client("admin") as client:
        text = client.get("/metrics").text
    assert "arbiter_redis_up" not in text  # 0 would read as a Redis outage
    assert "arbiter_rate_limit_fallback" not in text and "arbiter_rate_limit_replicas" not in text
    assert "arbiter_shed_total" in text and "arbiter_rate_limited_total" in text


def test_metrics_on_a_separate_port(stack: Stack, gateway_factory: Any) -> None:
    port = free_port()
    separate = gateway_factory(metrics_port=port)
    with separate.client(stack.project_key) as client:
        assert client.post("/v1/systemone", json=decision()).status_code == 200
        assert_error(client.get("/metrics"), 404)
    text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    assert samples(text)[("gen_ai_client_token_usage_count", token_labels("input"))] == 1


def test_the_project_label_can_be_dropped(stack: Stack, gateway_factory: Any) -> None:
    quiet = gateway_factory(metrics_project_label=False)
    with quiet.client(stack.project_key) as client:
        assert client.post("/v1/systemone", json=decision()).status_code == 200
    with quiet.client(stack.admin_key) as client:
        metrics = samples(client.get("/metrics").text)
    token_series = [dict(labels) for name, labels in metrics if name == "gen_ai_client_token_usage_count"]
    assert token_series and all("project" not in labels for labels in token_series)


def test_chat_requests_have_their_gateway_overhead_observed(stack: Stack) -> None:
    """Chat waits on its backend for the head and then for each chunk: that is not overhead."""
    stack.ollama_state.faults.latency = 0.3
    chat = {"model": "llama3.2", "messages": [{"role": "user", "content": "Hello"}]}
    with stack.client() as client:
        assert client.post("/v1/chat/completions", json=chat).status_code == 200
        assert client.post("/api/chat", json={**chat, "stream": True}).status_code == 200
    with stack.client("admin") as admin:
        metrics = samples(admin.get("/metrics").text)
    labels = (("gen_ai_operation_name", "chat"),)
    assert metrics.get(("arbiter_gateway_overhead_seconds_count", labels)) == 2
    assert metrics[("arbiter_gateway_overhead_seconds_sum", labels)] < 0.3  # the 0.3 s waits are the backend's


def test_usage_records_pending_and_dropped_are_exposed(stack: Stack) -> None:
    from app.telemetry.record import RequestRecord

    components = stack.gateway.app.components
    ledger = components.ledger
    values = scrape(stack)
    assert values[("arbiter_usage_pending", ())] == 0.0
    assert values[("arbiter_usage_records_dropped_total", ())] == 0.0
    ledger._drop(2, "a test")
    ledger.add(RequestRecord(request_id="r", operation="decision", route="/v1/systemone", model="nimble",
                             project_id=1, status=200))
    values = scrape(stack)
    assert values[("arbiter_usage_records_dropped_total", ())] == 2.0
    assert values[("arbiter_usage_pending", ())] >= 0.0  # read at scrape time (the timer may have written it)
