"""Helpers for the tests of POST /v1/decisions: the official `openai` SDK pointed at Arbiter,
raw calls, and the one check of OpenAI's error shape."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from openai import DefaultHttpxClient, OpenAI

from infra_adapters.admin import admin_tls
from tests.support import Stack

QWEN = "Qwen/Qwen3-0.6B"
TICKET = "The package arrived with a broken screen."
QUESTIONS: list[dict[str, Any]] = [
    {"type": "predicate", "name": "damaged", "instructions": "Does the customer report a damaged item?"},
    {"type": "choice", "name": "department", "instructions": "Which department should handle this?",
     "choices": [{"value": "returns", "description": "refunds and exchanges"}, {"value": "billing"}]},
    {"type": "score", "instructions": "How severe is the damage?",
     "levels": [{"label": "cosmetic"}, {"label": "broken", "description": "it does not work"}]},
]


def sdk(stack: Stack, key: str | None = None) -> OpenAI:
    return OpenAI(base_url=stack.gateway.url + "/v1", api_key=key or stack.project_key, max_retries=0,
                  http_client=DefaultHttpxClient(verify=admin_tls()))  # its own would make a TLS context: ~20 ms


def create(stack: Stack, model: str = "nimble", **kwargs: Any) -> Any:
    kwargs.setdefault("input", TICKET)
    kwargs.setdefault("questions", QUESTIONS)
    return sdk(stack).decisions.create(model=model, **kwargs)


def raw(stack: Stack, body: dict[str, Any], key: str | None = None) -> httpx.Response:
    with stack.gateway.client(key or stack.project_key) as client:
        return client.post("/v1/decisions", json=body)


def sent(state: Any, path: str) -> list[Any]:
    return [r.json for r in state.requests if r.path == path]


def openai_error(response: httpx.Response, status: int, type_: str, param: str | None = None) -> dict[str, Any]:
    """The response is an error in OpenAI's shape, exactly."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    error = body["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert error["type"] == type_ and error["param"] == param, error
    return error


def check_answers(decision: Any, names: list[str | None], values: list[Any]) -> None:
    assert [a.type for a in decision.answers] == ["predicate", "choice", "score"]
    assert [a.name for a in decision.answers] == names
    predicate, choice, score = decision.answers
    assert 0 <= predicate.probability <= 1
    assert [p.value for p in choice.probabilities] == values
    assert sum(p.probability for p in choice.probabilities) == pytest.approx(1)
    best = max(choice.probabilities, key=lambda p: p.probability)
    assert choice.choice == best.value and 0 <= choice.confidence <= 1
    assert [(p.value, p.label) for p in score.probabilities] == [(0, "cosmetic"), (1, "broken")]
    assert score.score == pytest.approx(sum(p.value * p.probability for p in score.probabilities))
    usage = decision.usage
    assert usage.output_tokens == 3 and usage.input_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens == 0 and usage.output_tokens_details.reasoning_tokens == 0
