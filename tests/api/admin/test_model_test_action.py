"""The Test action of a model card (SPEC §4): POST /admin/models/{id}/test, through the same
forwarding path as tenant requests, pinned to the card's service, billed to no project."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from infra_adapters.emulators.generation import EMBEDDING_DIM
from infra_adapters.emulators.ollama import OllamaState, make_ollama_app
from infra_adapters.emulators.server import EmulatorServer
from tests.support import Stack, assert_error, body, decision

OPTIONS = {"billing", "shipping", "security"}


def card(admin: httpx.Client, public_name: str, service: str = "ollama") -> int:
    [model] = [m for m in body(admin.get("/admin/models"), 200)["data"]
               if m["public_name"] == public_name and m["service"] == service]
    return int(model["id"])


def run_test(stack: Stack, public_name: str, service: str = "ollama") -> tuple[httpx.Response, dict[str, Any]]:
    with stack.client("admin") as admin:
        response = admin.post(f"/admin/models/{card(admin, public_name, service)}/test")
    return response, body(response, 200)


def last_used(stack: Stack) -> list[str | None]:
    with stack.client("admin") as admin:
        return [k["last_used_at"] for k in body(admin.get("/admin/projects/acme/keys"), 200)["data"]]


def test_a_decision_model_answers_one_choice_question(stack: Stack) -> None:
    response, result = run_test(stack, "nimble")
    assert result["ok"] is True and result["status"] == 200
    assert (result["kind"], result["model"]) == ("decision", "nimble")
    assert result["choice"] in OPTIONS and set(result["probabilities"]) == OPTIONS
    assert sum(result["probabilities"].values()) == pytest.approx(1)
    assert result["choice"] == max(result["probabilities"], key=result["probabilities"].get)
    assert 0 <= result["confidence"] <= 1 and result["latency_ms"] >= 0
    assert isinstance(result["question"], str) and result["question"]
    [seen] = [r for r in stack.ollama_state.requests if r.path == "/v1/systemone"]
    assert seen.json["model"] == "nimble:latest"  # the backend's name, as for a tenant
    [question] = seen.json["questions"].values()
    assert question["type"] == "choice" and set(question["criteria"]) == OPTIONS
    assert seen.header("x-request-id") == response.headers["x-request-id"]


def test_a_chat_model_gets_a_one_line_chat(stack: Stack) -> None:
    _, result = run_test(stack, "llama3.2")
    assert result["ok"] is True and result["status"] == 200 and result["kind"] == "completion"
    assert result["reply"] == "Echo: " + result["prompt"][:40]
    assert [r.path for r in stack.ollama_state.requests if r.path != "/api/version"
            and not r.path.startswith(("/api/tags", "/api/show"))] == ["/v1/chat/completions"]


def test_an_embedding_model_gets_an_embedding(stack: Stack) -> None:
    stack.ollama_state.models["nomic-embed-text"] = ["embedding"]
    with stack.client("admin") as admin:
        body(admin.post("/admin/services/ollama/refresh"), 200)
    _, result = run_test(stack, "nomic-embed-text")
    assert result["ok"] is True and result["kind"] == "embedding"
    assert result["dimensions"] == EMBEDDING_DIM and len(result["head"]) == 4
    assert [r.json["model"] for r in stack.ollama_state.requests if r.path == "/api/embed"] == [
        "nomic-embed-text:latest"]


def test_a_model_with_nothing_to_test_says_so(stack: Stack) -> None:
    stack.ollama_state.models["toolbox"] = ["tools"]
    with stack.client("admin") as admin:
        body(admin.post("/admin/services/ollama/refresh"), 200)
    _, result = run_test(stack, "toolbox")
    assert result["ok"] is False and result["kind"] == "other" and result["error"]


@pytest.mark.parametrize(("model", "path"), [("nimble", "/v1/systemone"), ("llama3.2", "/v1/chat/completions")])
def test_the_backends_error_is_shown(stack: Stack, model: str, path: str) -> None:
    faults = stack.ollama_state.faults
    faults.status, faults.body = 500, b'{"error":"llama runner process has terminated: exit status 2"}'
    _, result = run_test(stack, model)
    assert result["ok"] is False and result["status"] == 500
    assert "llama runner process has terminated: exit status 2" in result["error"]
    assert [r.path for r in stack.ollama_state.requests if r.path == path] == [path]


def test_an_unreachable_backend_is_an_error_not_a_crash(stack: Stack) -> None:
    stack.ollama.stop()
    try:
        _, result = run_test(stack, "nimble")
    finally:
        stack.ollama.start()
    assert result["ok"] is False and result["status"] == 502 and "nimble" in result["error"]


def test_tests_are_not_billed_to_any_project(stack: Stack) -> None:
    assert last_used(stack) == [None]
    for model in ("nimble", "llama3.2"):
        assert run_test(stack, model)[1]["ok"] is True
    time.sleep(0.5)  # several flush intervals of the gateway's batched key touches
    assert last_used(stack) == [None]
    with stack.client() as client:  # a tenant's request is what touches the key
        assert client.post("/v1/systemone", json=decision()).status_code == 200
    deadline = time.monotonic() + 15
    while last_used(stack) == [None]:
        assert time.monotonic() < deadline, "the tenant's request did not touch its key"
        time.sleep(0.1)


def test_a_test_is_pinned_to_the_cards_service(stack: Stack) -> None:
    other = OllamaState()
    with EmulatorServer(make_ollama_app(other)) as server:
        with stack.client("admin") as admin:
            body(admin.post("/admin/services", json={"type": "ollama-external", "url": server.url,
                                                     "name": "second"}), 201)
        for _ in range(3):
            assert run_test(stack, "nimble", service="second")[1]["ok"] is True
        other.faults.status = 503  # a replica failing does not send its Test elsewhere
        _, failed = run_test(stack, "nimble", service="second")
    assert failed["ok"] is False and failed["status"] == 503
    assert len([r for r in other.requests if r.path == "/v1/systemone"]) == 4
    assert not [r for r in stack.ollama_state.requests if r.path == "/v1/systemone"]


def test_unknown_model_id(stack: Stack) -> None:
    with stack.client("admin") as admin:
        assert "987654" in assert_error(admin.post("/admin/models/987654/test"), 404)["error"]
        assert_error(admin.post("/admin/models/not-a-number/test"), 400)
    with stack.client() as client:  # a project key never opens an admin route
        assert_error(client.post("/admin/models/1/test"), 401)


def counted_tests(stack: Stack) -> dict[tuple[str, str, str], float]:
    """Finished Tests in the metrics: (model, provider, error_type) -> how many."""
    with stack.client("admin") as admin:
        text = body_text(admin.get("/metrics"))
    counts: dict[tuple[str, str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "gen_ai_client_operation_duration_seconds_count":
                labels = sample.labels
                key = (labels["gen_ai_request_model"], labels["gen_ai_provider_name"], labels["error_type"])
                counts[key] = counts.get(key, 0) + sample.value
    return counts


def body_text(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return response.text


@pytest.mark.parametrize(("model", "answer"), [
    ("llama3.2", b'{"choices":["x"]}'),
    ("llama3.2", b'{"choices":[{"message":null}]}'),
    ("llama3.2", b'{"choices":[{"message":{"content":7}}]}'),
    ("llama3.2", b'["not", "an", "object"]'),
    ("nomic-embed-text", b'{"embeddings":[5]}'),
    ("nomic-embed-text", b'{"embeddings":[["a"]]}'),
    ("nomic-embed-text", b'{"data":[1]}'),
    ("nomic-embed-text", b'{"embeddings":[]}'),
])
def test_an_odd_answer_is_a_bad_gateway_not_a_crash_and_is_counted(stack: Stack, model: str,
                                                                    answer: bytes) -> None:
    stack.ollama_state.models["nomic-embed-text"] = ["embedding"]
    with stack.client("admin") as admin:
        body(admin.post("/admin/services/ollama/refresh"), 200)
    faults = stack.ollama_state.faults
    faults.status, faults.body, faults.content_type = 200, answer, "application/json"
    _, result = run_test(stack, model)
    assert result["ok"] is False and result["status"] == 502
    assert result["error"].startswith("unexpected answer: ") and answer.decode()[2:9] in result["error"]
    assert counted_tests(stack) == {(model, "ollama", "backend_error"): 1}


@pytest.mark.parametrize("model", ["nimble", "llama3.2"])
def test_a_backends_error_is_counted_under_its_status_and_provider(stack: Stack, model: str) -> None:
    stack.ollama_state.faults.status = 500  # its own error (a 5xx that takes no replica out)
    _, result = run_test(stack, model)
    assert result["ok"] is False and result["status"] == 500
    stack.ollama_state.faults.reset()
    assert run_test(stack, model)[1]["ok"] is True
    assert counted_tests(stack) == {(model, "ollama", "500"): 1, (model, "ollama", ""): 1}
