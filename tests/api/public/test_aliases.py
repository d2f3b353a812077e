"""Model aliases on the public routes (SPEC §1, §2): a request for an alias is the request for its
target on /v1/systemone, /v1/decisions and chat, the answer's ``model`` is the name sent; the
allowlist holds for the target; usage and metrics record both; a second replica sees a new
alias without a restart; GET /v1/models lists aliases in OpenAI's and TypeSafe's shapes, and
TypeSafe's own SDK reads it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from infra_adapters.admin import admin_tls
from tests.api.public.openai_sdk import QUESTIONS, TICKET
from tests.support import Gateway, Stack, assert_error, body, decision, wait_for

HELLO = [{"role": "user", "content": "Hello there"}]


def alias(stack: Stack, name: str, model: str) -> None:
    with stack.client("admin") as admin:
        body(admin.post("/admin/aliases", json={"alias": name, "model": model}), 201)


def sent_models(stack: Stack, path: str) -> list[str]:
    return [r.json["model"] for r in stack.ollama_state.requests if r.path == path]


def test_an_alias_answers_on_every_route_under_the_name_sent(stack: Stack) -> None:
    alias(stack, "jev-latest", "nimble")
    alias(stack, "chatty", "llama3.2")
    with stack.client() as tenant:
        systemone = body(tenant.post("/v1/systemone", json=decision("jev-latest")), 200)
        decisions = body(tenant.post("/v1/decisions", json={"model": "jev-latest", "input": TICKET,
                                                             "questions": QUESTIONS}), 200)
        openai_chat = body(tenant.post("/v1/chat/completions", json={"model": "chatty", "messages": HELLO}), 200)
        ollama_chat = body(tenant.post("/api/chat", json={"model": "chatty", "messages": HELLO, "stream": False}), 200)
    assert systemone["model"] == decisions["model"] == "jev-latest"
    assert openai_chat["model"] == ollama_chat["model"] == "chatty"
    assert set(systemone["answers"]) == {"team", "urgent", "tone"}
    # Forwarded under the target's backend name, as a request for the target is.
    assert sent_models(stack, "/v1/systemone") == ["nimble:latest", "nimble:latest"]
    assert sent_models(stack, "/v1/chat/completions") + sent_models(stack, "/api/chat") == ["llama3.2:latest"] * 2


def test_the_allowlist_holds_for_the_target(stack: Stack) -> None:
    """Naming the alias in an allowlist grants nothing: SPEC §1 checks the target."""
    alias(stack, "jev-latest", "nimble")
    allowed = stack.new_project("nimble-only", models=["nimble"])
    other = stack.new_project("clef-only", models=["clef"])
    alias_only = stack.new_project("alias-only", models=["jev-latest"])
    with stack.gateway.client(allowed) as tenant:
        assert body(tenant.post("/v1/systemone", json=decision("jev-latest")), 200)["model"] == "jev-latest"
        assert [m["id"] for m in body(tenant.get("/v1/models"), 200)["data"]] == ["jev-latest", "nimble"]
    for key in (other, alias_only):
        with stack.gateway.client(key) as tenant:
            error = assert_error(tenant.post("/v1/systemone", json=decision("jev-latest")), 403, "permission_error")
            assert "'jev-latest'" in error["error"] and "nimble" not in error["error"]  # the target stays unseen
            refused = tenant.post("/v1/decisions", json={"model": "jev-latest", "input": TICKET,
                                                         "questions": QUESTIONS})
            assert refused.status_code == 403 and refused.json()["error"]["type"] == "permission_error"
            assert "jev-latest" not in [m["id"] for m in body(tenant.get("/v1/models"), 200)["data"]]
    assert sent_models(stack, "/v1/systemone") == ["nimble:latest"]


def test_an_alias_whose_model_went_is_a_404_and_leaves_the_list(stack: Stack) -> None:
    alias(stack, "jev-latest", "nimble")
    with stack.client("admin") as admin:
        [nimble] = [m for m in body(admin.get("/admin/models"), 200)["data"] if m["public_name"] == "nimble"]
        body(admin.patch(f"/admin/models/{nimble['id']}", json={"public_name": "nimble-2"}), 200)
    with stack.client() as tenant:
        assert_error(tenant.post("/v1/systemone", json=decision("jev-latest")), 404, "not_found_error")
        assert "jev-latest" not in [m["id"] for m in body(tenant.get("/v1/models"), 200)["data"]]


def metric_samples(stack: Stack) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with stack.client("admin") as admin:
        text = admin.get("/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_usage_and_metrics_record_the_alias_and_the_target(stack: Stack) -> None:
    alias(stack, "jev-latest", "nimble")
    with stack.client() as tenant:
        answer = body(tenant.post("/v1/systemone", json=decision("jev-latest")), 200)
        body(tenant.post("/v1/systemone", json=decision("nimble")), 200)
        assert_error(tenant.post("/v1/systemone", json=decision("no-such-alias")), 404)
    with stack.client("admin") as admin:
        rows = wait_for(lambda: len(r := body(admin.get("/admin/usage/recent"), 200)["data"]) == 3 and r)
    assert sorted((r["model"], r["alias"] or "") for r in rows) == [
        ("_unknown", ""), ("nimble", ""), ("nimble", "jev-latest")]
    metrics = metric_samples(stack)
    through = (("alias", "jev-latest"), ("gen_ai_operation_name", "decision"), ("gen_ai_request_model", "nimble"))
    assert metrics[("arbiter_alias_requests_total", through)] == 1
    assert not [k for k in metrics if k[0] == "arbiter_alias_requests_total" and k != ("arbiter_alias_requests_total",
                                                                                        through)]
    tokens = tuple(sorted({"gen_ai_operation_name": "decision", "gen_ai_provider_name": "ollama",
                           "gen_ai_token_type": "input", "gen_ai_request_model": "nimble",
                           "project": "acme"}.items()))
    assert metrics[("gen_ai_client_token_usage_count", tokens)] == 2  # both count for the model
    assert not any(dict(k[1]).get("gen_ai_request_model") == "jev-latest" for k in metrics)
    assert answer["usage"]["input_tokens"] > 0


def test_a_second_replica_sees_a_new_alias_without_a_restart(stack: Stack,
                                                             gateway_factory: Callable[..., Gateway]) -> None:
    second = gateway_factory()
    with second.client(stack.project_key) as tenant:
        assert_error(tenant.post("/v1/systemone", json=decision("jev-latest")), 404)
        alias(stack, "jev-latest", "nimble")  # through the first replica
        wait_for(lambda: tenant.post("/v1/systemone", json=decision("jev-latest")).status_code == 200)
        with stack.client("admin") as admin:
            assert admin.delete("/admin/aliases/jev-latest").status_code == 204
        wait_for(lambda: tenant.post("/v1/systemone", json=decision("jev-latest")).status_code == 404)


def test_v1_models_has_openai_and_typesafe_shapes(stack: Stack) -> None:
    alias(stack, "jev-latest", "nimble")
    with stack.client() as tenant:
        listed = body(tenant.get("/v1/models"), 200)
    assert set(listed) == {"object", "data", "models"} and listed["object"] == "list"
    names = ["clef", "jev-latest", "llama3.2", "nimble"]
    assert [m["id"] for m in listed["data"]] == [m["name"] for m in listed["models"]] == names
    by_id = {m["id"]: m for m in listed["data"]}
    assert set(by_id["jev-latest"]) == {"id", "object", "created", "owned_by", "capabilities"}
    assert {k: v for k, v in by_id["jev-latest"].items() if k != "id"} == {
        k: v for k, v in by_id["nimble"].items() if k != "id"}
    assert by_id["nimble"]["object"] == "model" and by_id["nimble"]["capabilities"] == ["decision"]
    by_name = {m["name"]: m for m in listed["models"]}
    assert set(by_name["nimble"]) == {"name", "description", "release_date"}
    assert by_name["nimble"]["description"] == "Small, fast decision model for routing and triage."
    assert by_name["jev-latest"]["description"].startswith("Alias of nimble.")
    assert all(len(m["release_date"]) == 10 and m["release_date"][4] == "-" for m in listed["models"])


def test_typesafe_sdk_lists_the_models_and_decides_with_its_default_model(stack: Stack) -> None:
    sdk = pytest.importorskip("typesafe_sdk", reason="typesafe-sdk is in the test extra")
    httpx2 = pytest.importorskip("httpx2")
    alias(stack, sdk.constants.DEFAULT_MODEL, "nimble")  # jev-latest
    client: Any = sdk.TypeSafeClient(api_key=stack.project_key, base_url=stack.gateway.url,
                                     retry=sdk.RetryPolicy(max_retries=0),
                                     http_client=httpx2.Client(verify=admin_tls()))
    with client:
        models = client.models.list()
        answer = client.system_one(state="My card was charged twice.", questions={
            "team": sdk.Choice(instructions="Which team?", criteria={"billing": "payments", "shipping": None})})
    assert [m.name for m in models.models] == ["clef", "jev-latest", "llama3.2", "nimble"]
    assert all(m.description and m.release_date for m in models.models)
    assert answer.model == "jev-latest"
    assert set(answer.answers) == {"team"}


def test_a_project_key_is_needed_for_the_list(stack: Stack) -> None:
    with httpx.Client(base_url=stack.gateway.url, verify=admin_tls()) as anonymous:
        assert_error(anonymous.get("/v1/models"), 401)
    with stack.client("admin") as admin:  # an admin key never calls models
        assert admin.get("/v1/models").status_code in (401, 403)
