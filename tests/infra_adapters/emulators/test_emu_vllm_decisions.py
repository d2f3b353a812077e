"""The vLLM emulator's `/v1/decisions` (OpenAI's Decisions API, vLLM's text-only subset),
read with the official `openai` SDK as a client of vLLM would."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from infra_adapters.emulators.server import EmulatorServer
from infra_adapters.emulators.vllm import VllmState

MODEL = "Qwen/Qwen3-0.6B"
QUESTIONS: list[dict[str, Any]] = [
    {"type": "predicate", "name": "damaged", "instructions": "Damaged?"},
    {"type": "choice", "instructions": "Which?", "choices": [{"value": True}, {"value": "true"}]},
    {"type": "score", "name": "severity", "instructions": "How bad?",
     "levels": [{"label": "minor"}, {"label": "major"}, {"label": "total"}]},
]


def _client(server: tuple[VllmState, EmulatorServer]) -> OpenAI:
    return OpenAI(base_url=server[1].url + "/v1", api_key="EMPTY", max_retries=0)


def _error(resp: httpx.Response, status: int, err_type: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    error: dict[str, Any] = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"]) == (err_type, status)
    return error


def test_answers_follow_the_sdk(vllm: VllmState, vllm_server: tuple[VllmState, EmulatorServer]) -> None:
    decision = _client(vllm_server).decisions.create(model=MODEL, input="It broke.", questions=QUESTIONS)
    assert decision.model == MODEL
    assert [(a.type, a.name) for a in decision.answers] == [
        ("predicate", "damaged"), ("choice", None), ("score", "severity")]
    _, choice, score = decision.answers
    assert [p.value for p in choice.probabilities] == [True, "true"]
    assert choice.choice == max(choice.probabilities, key=lambda p: p.probability).value
    assert score.score == pytest.approx(sum(p.value * p.probability for p in score.probabilities))
    assert [p.label for p in score.probabilities] == ["minor", "major", "total"]
    assert decision.usage.output_tokens == 3
    assert decision.usage.total_tokens == decision.usage.input_tokens + 3


def test_the_same_question_gets_the_same_answer(vllm: VllmState,
                                                vllm_server: tuple[VllmState, EmulatorServer]) -> None:
    client = _client(vllm_server)
    one = client.decisions.create(model=MODEL, input="It broke.", questions=QUESTIONS)
    messages = [{"role": "user", "content": [{"type": "input_text", "text": "It broke."}]}]
    two = client.decisions.create(model=MODEL, input=messages, questions=list(reversed(QUESTIONS)))
    assert one.answers == list(reversed(two.answers))


@pytest.mark.parametrize(("body", "status", "err_type"), [
    ({"input": "x", "questions": QUESTIONS, "temperature": 0}, 400, "BadRequestError"),
    ({"input": [{"role": "system", "content": "x"}], "questions": QUESTIONS}, 400, "BadRequestError"),
    ({"input": "x", "questions": [{"type": "choice", "instructions": "?",
                                   "choices": [{"value": str(i)} for i in range(27)]}]}, 400, "BadRequestError"),
    ({"input": "x", "questions": [{"type": "choice", "instructions": "?",
                                   "choices": [{"value": "a"}, {"value": 1}]}]}, 400, "BadRequestError"),
    ({"input": "x", "questions": [QUESTIONS[0]] * 65}, 400, "BadRequestError"),
    ({"model": "nope", "input": "x", "questions": QUESTIONS}, 404, "NotFoundError"),
])
def test_refusals_have_vllms_shape(vllm: VllmState, vllm_client: httpx.Client, body: dict[str, Any],
                                   status: int, err_type: str) -> None:
    _error(vllm_client.post("/v1/decisions", json={"model": MODEL, **body}), status, err_type)


def test_no_read_strategy_is_501_and_an_old_vllm_has_no_route(
        vllm: VllmState, vllm_client: httpx.Client, vllm_server: tuple[VllmState, EmulatorServer]) -> None:
    vllm.models[MODEL]["read_strategy"] = False
    _error(vllm_client.post("/v1/decisions", json={"model": MODEL, "input": "x", "questions": QUESTIONS}),
           501, "NotImplementedError")
    vllm.openai_decisions = False
    resp = vllm_client.post("/v1/decisions", json={"model": MODEL, "input": "x", "questions": QUESTIONS})
    assert (resp.status_code, resp.json()) == (404, {"detail": "Not Found"})
    with pytest.raises(openai.NotFoundError):
        _client(vllm_server).decisions.create(model=MODEL, input="x", questions=QUESTIONS)
