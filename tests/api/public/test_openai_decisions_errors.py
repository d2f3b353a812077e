"""POST /v1/decisions: every error in OpenAI's shape (`{"error": {"message", "type", "param",
"code"}}`), read through the SDK's exception classes; limits, unknown fields, unsupported input."""

from __future__ import annotations

import logging
import time
from typing import Any

import openai
import pytest

from tests.api.public.openai_sdk import QUESTIONS, create, openai_error, raw, sdk, sent
from tests.support import Stack, decision


def test_authentication_permission_and_not_found(stack: Stack) -> None:
    with pytest.raises(openai.AuthenticationError) as auth:
        sdk(stack, "arb_proj_nope").decisions.create(model="nimble", input="x", questions=QUESTIONS)
    assert auth.value.type == "authentication_error" and "arb_proj_nope" not in auth.value.message
    response = raw(stack, {"model": "nimble", "input": "x", "questions": QUESTIONS}, key="arb_proj_nope")
    openai_error(response, 401, "authentication_error")
    assert response.headers["www-authenticate"] == "Bearer"
    limited = stack.new_project("limited", models=["clef"])
    with pytest.raises(openai.PermissionDeniedError) as denied:
        sdk(stack, limited).decisions.create(model="nimble", input="x", questions=QUESTIONS)
    assert denied.value.type == "permission_error" and "not allowed" in denied.value.message
    with pytest.raises(openai.PermissionDeniedError):  # 403 whether or not the model exists
        sdk(stack, limited).decisions.create(model="ghost", input="x", questions=QUESTIONS)
    with pytest.raises(openai.NotFoundError) as missing:
        create(stack, "ghost")
    assert missing.value.type == "not_found_error" and "ghost" in missing.value.message


def test_safety_identifier_is_metadata_not_a_credential(stack: Stack, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(openai.AuthenticationError):
        sdk(stack, "arb_proj_nope").decisions.create(model="nimble", input="x", questions=QUESTIONS,
                                                     safety_identifier=stack.project_key[:64])
    caplog.set_level(logging.INFO, logger="arbiter.access")
    create(stack, safety_identifier="end-user-7")
    # The access line is written just after the answer is sent; the refused request above has one
    # too (every request does), which may land after the level is set: wait for the decision's.
    deadline = time.monotonic() + 10

    def decided() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.name == "arbiter.access" and getattr(r, "operation", None)]
    while not (lines := decided()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert getattr(lines[-1], "metadata", None) == {"safety_identifier": "end-user-7"}
    assert "safety_identifier" not in sent(stack.ollama_state, "/v1/systemone")[-1]
    with pytest.raises(openai.BadRequestError) as info:
        create(stack, safety_identifier="x" * 65)
    assert info.value.param == "safety_identifier"


@pytest.mark.parametrize(("extra", "param", "code"), [
    ({"temperature": 0.2}, "temperature", "unknown_parameter"),
    ({"stream": True}, "stream", "unsupported_parameter"),
    ({"tools": [{"type": "function", "name": "f"}]}, "tools", "unsupported_parameter"),
    ({"images": ["iVBORw0KGgo="]}, "images", "unknown_parameter"),
])
def test_unknown_fields_streaming_and_tools_are_400(stack: Stack, extra: dict[str, Any], param: str,
                                                      code: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        create(stack, extra_body=extra)
    assert info.value.param == param and info.value.code == code and info.value.type == "invalid_request_error"


@pytest.mark.parametrize(("input_", "param"), [
    ([{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}]}],
     "input[0].content[0].type"),
    ([{"role": "user", "content": [{"type": "input_json", "data": {"a": 1}}]}], "input[0].content[0].type"),
    ([{"role": "system", "content": "You are strict."}], "input[0].role"),
    ([{"role": "assistant", "content": "Sure."}], "input[0].role"),
    ([{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}], "input[0].type"),
    ([], "input"),
    (42, "input"),
])
def test_unsupported_input_is_400(stack: Stack, input_: Any, param: str) -> None:
    response = raw(stack, {"model": "nimble", "input": input_, "questions": QUESTIONS})
    openai_error(response, 400, "invalid_request_error", param)
    assert sent(stack.ollama_state, "/v1/systemone") == []


def choice_of(n: int) -> dict[str, Any]:
    return {"type": "choice", "instructions": "?", "choices": [{"value": f"o{i}"} for i in range(n)]}


def score_of(n: int) -> dict[str, Any]:
    return {"type": "score", "instructions": "?", "levels": [{"label": f"l{i}"} for i in range(n)]}


@pytest.mark.parametrize(("questions", "param", "code"), [
    ([QUESTIONS[0]] * 65, "questions", "array_above_max_length"),
    ([], "questions", "empty_array"),
    ([choice_of(256)], "questions[0].choices", "array_above_max_length"),
    ([choice_of(1)], "questions[0].choices", "array_below_min_length"),
    ([score_of(11)], "questions[0].levels", "array_above_max_length"),
    ([score_of(1)], "questions[0].levels", "array_below_min_length"),
    ([{"type": "noul", "instructions": "?"}], "questions[0].type", "invalid_value"),
    ([{"type": "predicate"}], "questions[0].instructions", "missing_required_parameter"),
    ([{"type": "predicate", "instructions": "?", "criteria": None}], "questions[0].criteria", "unknown_parameter"),
])
def test_requests_over_the_limits_are_400(stack: Stack, questions: list[Any], param: str, code: str) -> None:
    response = raw(stack, {"model": "nimble", "input": "x", "questions": questions})
    assert openai_error(response, 400, "invalid_request_error", param)["code"] == code
    assert sent(stack.ollama_state, "/v1/systemone") == []


def test_the_limits_themselves_are_accepted(stack: Stack) -> None:
    decision = create(stack, questions=[QUESTIONS[0]] * 60 + [choice_of(255), score_of(10), choice_of(2),
                                                               score_of(2)])
    assert len(decision.answers) == 64 and len(decision.answers[60].probabilities) == 255


def test_bodies_that_are_not_json_or_too_large(stack: Stack, gateway_factory: Any) -> None:
    with stack.gateway.client(stack.project_key) as client:
        response = client.post("/v1/decisions", content=b'{"model": "nimble", "model": "x"}')
        assert "duplicate key" in openai_error(response, 400, "invalid_request_error")["message"]
        openai_error(client.post("/v1/decisions", content=b"[1, 2]"), 400, "invalid_request_error")
    huge = "word " * 15000  # 75 KB of text: over the service's 64 KiB text limit
    response = raw(stack, {"model": "nimble", "input": huge, "questions": QUESTIONS})
    assert "text" in openai_error(response, 413, "request_too_large")["message"]
    small = gateway_factory(max_body_bytes=4096)
    with small.client(stack.project_key) as client:
        response = client.post("/v1/decisions", json={"model": "nimble", "input": huge, "questions": QUESTIONS})
    openai_error(response, 413, "request_too_large")
    assert response.headers["connection"] == "close"


def test_a_wrong_method_is_405_in_openai_shape(stack: Stack) -> None:
    with stack.gateway.client(stack.project_key) as client:
        response = client.get("/v1/decisions")
    openai_error(response, 405, "method_not_allowed")
    assert response.headers["allow"] == "POST"


def test_rate_limits_apply(stack: Stack) -> None:
    with stack.client("admin") as admin:
        assert admin.patch("/admin/projects/acme", json={"requests_per_minute": 2}).status_code == 200
    create(stack)
    with stack.client() as client:  # one limit for both decision endpoints
        assert client.post("/v1/systemone", json=decision()).status_code == 200
    with pytest.raises(openai.RateLimitError) as info:
        create(stack)
    assert info.value.type == "rate_limit_error" and info.value.code == "rate_limit_exceeded"
    assert int(info.value.response.headers["retry-after"]) >= 1


def test_backend_errors_in_openai_shape(stack: Stack) -> None:
    faults = stack.ollama_state.faults
    faults.status, faults.body, faults.content_type = 400, b'{"error":"model is overloaded"}', "application/json"
    with pytest.raises(openai.BadRequestError) as info:
        create(stack)
    assert info.value.body == {"message": "model is overloaded", "type": "invalid_request_error",
                               "param": None, "code": None}
    faults.reset()
    faults.status, faults.body, faults.content_type = 429, b'{"error":"slow down"}', "application/json"
    faults.headers = {"Retry-After": "9"}
    limited = raw(stack, {"model": "nimble", "input": "x", "questions": QUESTIONS})
    assert limited.status_code == 429 and limited.headers["retry-after"] == "9"
    faults.reset()
    faults.non_json = True
    with pytest.raises(openai.APIStatusError) as broken:
        create(stack)
    assert broken.value.status_code == 502 and broken.value.type == "backend_error"
    faults.reset()
    faults.status, faults.body, faults.content_type = 200, b'{"answers": {}}', "application/json"
    error = openai_error(raw(stack, {"model": "nimble", "input": "x", "questions": QUESTIONS}), 502, "backend_error")
    assert "has no answer" in error["message"]
    faults.reset()
    assert create(stack).model == "nimble"


def test_a_system_one_answer_orjson_refuses_is_translated_or_a_502_never_passed_on(stack: Stack) -> None:
    faults = stack.ollama_state.faults
    body = {"model": "nimble", "input": "x",
            "questions": [{"type": "predicate", "name": "damaged", "instructions": "Damaged?"}]}
    answer = (b'{"model":"nimble:latest","answers":{"damaged":{"type":"noul","noul":%s}},'
              b'"usage":{"input_tokens":5,"output_tokens":1},"x":%s}')
    # Valid JSON past a double's range (or a lone surrogate) in a field the translation does not read.
    for extra in (b"1e400", b'"\\ud800"'):
        faults.status, faults.body, faults.content_type = 200, answer % (b"0.3", extra), "application/json"
        response = raw(stack, body)
        assert response.status_code == 200, response.text
        assert response.json() == {
            "model": "nimble", "answers": [{"type": "predicate", "name": "damaged", "probability": 0.3}],
            "usage": {"input_tokens": 5, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                      "output_tokens": 1, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 6}}
    # Where the translation needs the number, or the answer is no JSON object: a 502 in OpenAI's shape.
    for broken in (answer % (b"1e400", b"1"), b"[1e400]", answer % (b"0.3", b"NaN")):
        faults.body = broken
        error = openai_error(raw(stack, body), 502, "backend_error")
        assert "cannot be read as an OpenAI decision" in error["message"]
    faults.reset()
