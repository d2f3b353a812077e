"""The vLLM emulator's `/v1/decisions` (OpenAI's Decisions API as vLLM 0.33 serves it,
vllm/entrypoints/openai/decisions/), read with the official `openai` SDK as a client of vLLM would,
and its refusals as real vLLM returns them."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from infra_adapters.emulators.server import EmulatorServer
from infra_adapters.emulators.vllm import VllmState
from infra_adapters.emulators.vllm_decisions import read_prompt
from tests.infra_adapters.emulators.vllm_errors import invalid as _invalid
from tests.infra_adapters.emulators.vllm_errors import refused as _refused

MODEL = "Qwen/Qwen3-0.6B"
QUESTIONS: list[dict[str, Any]] = [
    {"type": "predicate", "name": "damaged", "instructions": "Damaged?"},
    {"type": "choice", "instructions": "Which?", "choices": [{"value": True}, {"value": "true"}]},
    {"type": "score", "name": "severity", "instructions": "How bad?",
     "levels": [{"label": "minor"}, {"label": "major"}, {"label": "total"}]},
]


def _client(server: tuple[VllmState, EmulatorServer]) -> OpenAI:
    return OpenAI(base_url=server[1].url + "/v1", api_key="EMPTY", max_retries=0)


def _post(client: httpx.Client, **body: Any) -> httpx.Response:
    return client.post("/v1/decisions", json={"model": MODEL, "input": "x", "questions": QUESTIONS[:1], **body})


def _systemone(client: httpx.Client, state: str, question: dict[str, Any]) -> dict[str, Any]:
    resp = client.post("/v1/systemone", json={"model": MODEL, "state": state, "questions": {"q": question}})
    assert resp.status_code == 200, resp.text
    answer: dict[str, Any] = resp.json()["answers"]["q"]
    return answer


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


def test_the_body_is_vllms_decision_response(vllm_client: httpx.Client) -> None:
    resp = _post(vllm_client, questions=QUESTIONS)
    assert resp.status_code == 200, resp.text
    data = resp.json()
    assert set(data) == {"model", "answers", "usage"}  # protocol.py DecisionResponse: no id, object, created
    usage = data["usage"]
    assert set(usage) == {"input_tokens", "input_tokens_details", "output_tokens", "output_tokens_details",
                          "total_tokens"}
    assert usage["input_tokens_details"] == {"cached_tokens": 0, "cache_write_tokens": 0}
    assert usage["output_tokens_details"] == {"reasoning_tokens": 0}
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert [set(a) for a in data["answers"]] == [
        {"type", "name", "probability"},
        {"type", "name", "choice", "probabilities", "confidence"},
        {"type", "name", "score", "probabilities", "confidence"}]


def test_a_predicate_is_read_as_false_then_true(vllm_client: httpx.Client) -> None:
    # adapters.py make_read_question: options "false", "true" (labels A, B); make_answer: probs[1]
    assert read_prompt("It broke.", QUESTIONS[0]) == (
        "It broke.\n\nQuestion: Damaged?\nA: false\nB: true\nAnswer with the letter of one option only.")
    (answer,) = _post(vllm_client, input="It broke.").json()["answers"]
    same = _systemone(vllm_client, "It broke.", {"type": "choice", "instructions": "Damaged?",
                                                 "criteria": {"false": None, "true": None}})
    assert answer == {"type": "predicate", "name": "damaged", "probability": same["probabilities"]["true"]}


def test_choice_values_are_read_as_json_text(vllm_client: httpx.Client) -> None:
    question = {"type": "choice", "instructions": "Pick",
                "choices": [{"value": "true", "description": "yes it is"}, {"value": True}, {"value": "é"}]}
    assert read_prompt("x", question) == (
        'x\n\nQuestion: Pick\nA: "true" - yes it is\nB: true\nC: "é"\nAnswer with the letter of one option only.')
    (answer,) = _post(vllm_client, questions=[question]).json()["answers"]
    same = _systemone(vllm_client, "x", {"type": "choice", "instructions": "Pick",
                                         "criteria": {'"true"': "yes it is", "true": None, '"é"': None}})
    assert [p["probability"] for p in answer["probabilities"]] == list(same["probabilities"].values())
    assert [p["value"] for p in answer["probabilities"]] == ["true", True, "é"]
    assert answer["confidence"] == same["confidence"]


def test_input_text_joins_parts_by_line_and_messages_by_paragraph(vllm_client: httpx.Client) -> None:
    messages = [{"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
                {"role": "user", "content": "c", "type": "message"}]
    joined = _post(vllm_client, input=messages, questions=QUESTIONS).json()
    assert joined == _post(vllm_client, input="a\nb\n\nc", questions=QUESTIONS).json()
    assert joined != _post(vllm_client, input="a\n\nb\n\nc", questions=QUESTIONS).json()
    assert _post(vllm_client, input=[]).status_code == 200  # no messages: an empty input


def test_the_same_question_gets_the_same_answer(vllm: VllmState,
                                                vllm_server: tuple[VllmState, EmulatorServer]) -> None:
    client = _client(vllm_server)
    one = client.decisions.create(model=MODEL, input="It broke.", questions=QUESTIONS)
    messages = [{"role": "user", "content": [{"type": "input_text", "text": "It broke."}]}]
    two = client.decisions.create(model=MODEL, input=messages, questions=list(reversed(QUESTIONS)))
    assert one.answers == list(reversed(two.answers))


@pytest.mark.parametrize(("body", "param", "errors"), [
    ({"temperature": 0, "top_p": 1}, "body.temperature", [
        "{'type': 'extra_forbidden', 'loc': 'body.temperature', 'msg': 'Extra inputs are not permitted', 'input': '0'}",
        "{'type': 'extra_forbidden', 'loc': 'body.top_p', 'msg': 'Extra inputs are not permitted', 'input': '1'}"]),
    ({"prompt_cache_key": "k"}, "body.prompt_cache_key", [
        ("{'type': 'extra_forbidden', 'loc': 'body.prompt_cache_key', 'msg': 'Extra inputs are not permitted', "
        "'input': 'k'}")]),
    ({"prompt_cache_options": {}}, "body.prompt_cache_options", [
        ("{'type': 'extra_forbidden', 'loc': 'body.prompt_cache_options', 'msg': 'Extra inputs are not permitted', "
        "'input': '<dict of 0 items>'}")]),
    ({"prompt_cache_breakpoint": 1}, "body.prompt_cache_breakpoint", [
        ("{'type': 'extra_forbidden', 'loc': 'body.prompt_cache_breakpoint', 'msg': 'Extra inputs are not "
        "permitted', 'input': '1'}")]),
    ({"instructions": "x"}, "body.instructions", [
        ("{'type': 'extra_forbidden', 'loc': 'body.instructions', 'msg': 'Extra inputs are not permitted', "
        "'input': 'x'}")]),
    ({"safety_identifier": "u" * 129}, "body.safety_identifier", [
        (f"{{'type': 'string_too_long', 'loc': 'body.safety_identifier', 'msg': 'String should have at most 128 "
        f"characters', 'input': '{'u' * 129}', 'ctx': {{'max_length': 128}}}}")]),
    ({"joint": "true"}, "body.joint", [
        "{'type': 'bool_type', 'loc': 'body.joint', 'msg': 'Input should be a valid boolean', 'input': 'true'}"]),
    ({"model": None}, "body.model", [
        "{'type': 'string_type', 'loc': 'body.model', 'msg': 'Input should be a valid string', 'input': 'None'}"]),
    ({"input": 5}, "body.input.constrained-str", [
        ("{'type': 'string_type', 'loc': 'body.input.constrained-str', 'msg': 'Input should be a valid string', "
        "'input': '5'}"),
        "{'type': 'list_type', 'loc': 'body.input', 'msg': 'Input should be a valid list', 'input': '5'}"]),
    ({"input": [{"role": "system", "content": "x"}]}, "body.input.constrained-str", [
        ("{'type': 'string_type', 'loc': 'body.input.constrained-str', 'msg': 'Input should be a valid string', "
        "'input': '<list of 1 items>'}"),
        ("{'type': 'literal_error', 'loc': 'body.input.0.role', 'msg': \"Input should be 'user'\", 'input': 'system', "
        "'ctx': {'expected': \"'user'\"}}")]),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "body.input.constrained-str", [
        ("{'type': 'string_type', 'loc': 'body.input.constrained-str', 'msg': 'Input should be a valid string', "
        "'input': '<list of 1 items>'}"),
        ("{'type': 'value_error', 'loc': 'body.input.0', 'msg': 'Value error, Decisions supports text input only; "
        "images are not supported', 'input': '<dict of 2 items>', 'ctx': {'error': ValueError('Decisions supports "
        "text input only; images are not supported')}}")]),
    ({"questions": []}, "body.questions", [
        ("{'type': 'too_short', 'loc': 'body.questions', 'msg': 'List should have at least 1 item after validation, "
        "not 0', 'input': '<list of 0 items>', 'ctx': {'field_type': 'List', 'min_length': 1, 'actual_length': 0}}")]),
    ({"questions": QUESTIONS[:1] * 201}, "body.questions", [
        ("{'type': 'too_long', 'loc': 'body.questions', 'msg': 'List should have at most 200 items after validation, "
        "not 201', 'input': '<list of 201 items>', 'ctx': {'field_type': 'List', 'max_length': 200, "
        "'actual_length': 201}}")]),
    ({"questions": [{"type": "predicate", "instructions": "?", "name": None}]}, "body.questions.0.predicate", [
        ("{'type': 'value_error', 'loc': 'body.questions.0.predicate', 'msg': 'Value error, name must be a string "
        "when provided', 'input': '<dict of 3 items>', 'ctx': {'error': ValueError('name must be a string when "
        "provided')}}")]),
    ({"questions": [{"type": "predicate", "instructions": [{"type": "input_text", "text": "a"}]}]},
     "body.questions.0.predicate.instructions", [
        ("{'type': 'string_type', 'loc': 'body.questions.0.predicate.instructions', 'msg': 'Input should be a valid "
        "string', 'input': '<list of 1 items>'}")]),
    ({"questions": [{"type": "predicate", "instructions": "?", "extra": 1}]}, "body.questions.0.predicate.extra", [
        ("{'type': 'extra_forbidden', 'loc': 'body.questions.0.predicate.extra', 'msg': 'Extra inputs are not "
        "permitted', 'input': '1'}")]),
    ({"questions": [{"type": "vote", "instructions": "?"}]}, "body.questions.0", [
        ("{'type': 'union_tag_invalid', 'loc': 'body.questions.0', 'msg': \"Input tag 'vote' found using 'type' does "
        "not match any of the expected tags: 'predicate', 'choice', 'score'\", 'input': '<dict of 2 items>', 'ctx': "
        "{'discriminator': \"'type'\", 'tag': 'vote', 'expected_tags': \"'predicate', 'choice', 'score'\"}}")]),
    ({"questions": [{"type": "choice", "instructions": "?",
                     "choices": [{"value": "a", "description": None}, {"value": "b"}]}]},
     "body.questions.0.choice.choices.0.description", [
        ("{'type': 'string_type', 'loc': 'body.questions.0.choice.choices.0.description', 'msg': 'Input should be a "
        "valid string', 'input': 'None'}")]),
    ({"questions": [{"type": "choice", "instructions": "?", "choices": [{"value": "a"}, {"value": 1}]}]},
     "body.questions.0.choice.choices.1.value", [
        ("{'type': 'string_type', 'loc': 'body.questions.0.choice.choices.1.value', 'msg': 'Input should be a valid "
        "string', 'input': '1'}"),
        ("{'type': 'bool_type', 'loc': 'body.questions.0.choice.choices.1.value', 'msg': 'Input should be a valid "
        "boolean', 'input': '1'}")]),
    ({"questions": [{"type": "choice", "instructions": "?", "choices": [{"value": "a"}, {"value": "a"}]}]},
     "body.questions.0.choice", [
        ("{'type': 'value_error', 'loc': 'body.questions.0.choice', 'msg': 'Value error, choice values must be "
        "distinct', 'input': '<dict of 3 items>', 'ctx': {'error': ValueError('choice values must be distinct')}}")]),
    ({"questions": [{"type": "choice", "instructions": "?", "choices": [{"value": str(i)} for i in range(256)]}]},
     "body.questions.0.choice.choices", [
        ("{'type': 'too_long', 'loc': 'body.questions.0.choice.choices', 'msg': 'List should have at most 255 items "
        "after validation, not 256', 'input': '<list of 256 items>', 'ctx': {'field_type': 'List', 'max_length': "
        "255, 'actual_length': 256}}")]),
    ({"questions": [{"type": "score", "instructions": "?", "levels": [{"label": str(i)} for i in range(11)]}]},
     "body.questions.0.score.levels", [
        ("{'type': 'too_long', 'loc': 'body.questions.0.score.levels', 'msg': 'List should have at most 10 items "
        "after validation, not 11', 'input': '<list of 11 items>', 'ctx': {'field_type': 'List', 'max_length': 10, "
        "'actual_length': 11}}")]),
])
def test_schema_refusals(vllm_client: httpx.Client, body: dict[str, Any], param: str, errors: list[str]) -> None:
    _invalid(_post(vllm_client, **body), param, *errors)


def test_server_refusals(vllm_client: httpx.Client, vllm: VllmState) -> None:
    many = [{"type": "choice", "instructions": "?", "choices": [{"value": str(i)} for i in range(27)]}]
    _refused(_post(vllm_client, questions=many), "This model supports at most 26 choices per question")
    _refused(_post(vllm_client, questions=QUESTIONS[:1] * 65), "questions: at most 64 for this model")
    _refused(_post(vllm_client, joint=True),
             "joint: this model reads each question on its own; joint reads need DiffusionGemma")
    _refused(_post(vllm_client, cache_salt="", extra=1),
             "Parameter 'cache_salt' must be a non-empty string if provided. (parameter=cache_salt)", "cache_salt")
    _refused(_post(vllm_client, model="nope"), f"The model `nope` does not exist. Valid aliases: {MODEL}.",
             "model", 404, "NotFoundError")
    vllm.models[MODEL]["max_model_len"] = 8
    message = _post(vllm_client).json()["error"]["message"]
    assert message.startswith("The decoder prompt (length ") and "maximum model length of 8." in message


def test_no_read_strategy_is_501_and_an_old_vllm_has_no_route(
        vllm: VllmState, vllm_client: httpx.Client, vllm_server: tuple[VllmState, EmulatorServer]) -> None:
    vllm.models[MODEL]["read_strategy"] = False
    _refused(_post(vllm_client), "The model does not support the Decisions API", status=501,
             err_type="NotImplementedError")
    vllm.models["vllm-sr/d3"] = {"instructions": False}  # D3 reads by classify, not generate
    _refused(_post(vllm_client, model="vllm-sr/d3"), "The model does not support the Decisions API", status=501,
             err_type="NotImplementedError")
    vllm.openai_decisions = False
    resp = _post(vllm_client)
    assert (resp.status_code, resp.json()) == (404, {"detail": "Not Found"})
    with pytest.raises(openai.NotFoundError):
        _client(vllm_server).decisions.create(model=MODEL, input="x", questions=QUESTIONS)
