"""POST /v1/decisions, the OpenAI Decisions API, driven by the official `openai` SDK: translated
onto System One for Ollama, forwarded straight to vLLM's own /v1/decisions, with the same usage,
metrics and traces as /v1/systemone. Errors: test_openai_decisions_errors.py."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

from app.db.models import UsageRecord
from tests.api.public.openai_sdk import (
    QUESTIONS,
    QWEN,
    TICKET,
    check_answers,
    create,
    openai_error,
    raw,
    sdk,
    sent,
)
from tests.support import Stack

# -- translated onto System One (Ollama) --------------------------------------------------


def test_ollama_answers_in_question_order_with_names_and_usage(stack: Stack) -> None:
    decision = create(stack)
    assert decision.model == "nimble"
    check_answers(decision, ["damaged", "department", None], ["returns", "billing"])
    [asked] = sent(stack.ollama_state, "/v1/systemone")
    assert asked == {"model": "nimble:latest", "state": TICKET, "questions": {
        "damaged": {"type": "noul", "instructions": "Does the customer report a damaged item?"},
        "department": {"type": "choice", "instructions": "Which department should handle this?",
                       "criteria": {"returns": "refunds and exchanges", "billing": None}},
        "questions[2]": {"type": "score", "instructions": "How severe is the damage?",
                         "criteria": ["cosmetic", "broken: it does not work"]}}}
    # The wire answer has exactly the SDK's fields; an unnamed question's name is null, not absent.
    body = raw(stack, {"model": "nimble", "input": TICKET, "questions": QUESTIONS}).json()
    assert set(body) == {"model", "answers", "usage"}
    assert [a["name"] for a in body["answers"]] == ["damaged", "department", None]
    assert set(body["answers"][1]) == {"type", "name", "choice", "confidence", "probabilities"}
    assert set(body["usage"]) == {"input_tokens", "input_tokens_details", "output_tokens",
                                  "output_tokens_details", "total_tokens"}


def test_the_answer_is_the_system_one_answer_translated(stack: Stack) -> None:
    decision = create(stack)
    asked = sent(stack.ollama_state, "/v1/systemone")[-1]
    direct = httpx.post(stack.ollama.url + "/v1/systemone", json=asked).json()["answers"]
    predicate, choice, score = decision.answers
    assert predicate.probability == direct["damaged"]["noul"]
    assert choice.choice == direct["department"]["choice"]
    assert [p.probability for p in choice.probabilities] == list(direct["department"]["probabilities"].values())
    assert choice.confidence == direct["department"]["confidence"]
    assert score.score == direct["questions[2]"]["score"]
    assert decision.usage.input_tokens == httpx.post(stack.ollama.url + "/v1/systemone", json=asked).json()[
        "usage"]["input_tokens"]


@pytest.mark.parametrize("values", [
    [True, "true", False, "false"],  # a string and a boolean with the same text are distinct
    ["true", True, "", "1", "1.0"],  # order does not matter; "" needs a name of its own
    ["x (option 2)", "x", "x (option 2) "],  # names that look like generated ones
])
def test_typed_choice_values_come_back_with_their_type(stack: Stack, values: list[Any]) -> None:
    question = {"type": "choice", "instructions": "Which one?", "choices": [{"value": v} for v in values]}
    decision = create(stack, questions=[question, QUESTIONS[0]])
    choice = decision.answers[0]
    got = [p.value for p in choice.probabilities]
    assert got == values and [type(v) for v in got] == [type(v) for v in values]
    asked = sent(stack.ollama_state, "/v1/systemone")[-1]["questions"]["questions[0]"]["criteria"]
    names = list(asked)
    assert len(set(names)) == len(values) and all(names)
    texts = [("true" if v else "false") if isinstance(v, bool) else v for v in values]
    # Names read like the values (the model reads them); a repeated or empty text gets the position.
    assert all(name.startswith(text) for name, text in zip(names, texts, strict=True))
    assert all(names[i] == text for i, text in enumerate(texts) if text and text not in texts[:i])
    # The typed value returned is the one whose option name the backend chose.
    direct = httpx.post(stack.ollama.url + "/v1/systemone", json=sent(stack.ollama_state, "/v1/systemone")[-1])
    chosen = direct.json()["answers"]["questions[0]"]["choice"]
    expected = values[names.index(chosen)]
    assert choice.choice == expected and type(choice.choice) is type(expected)
    # On the wire too: JSON booleans stay booleans.
    body = raw(stack, {"model": "nimble", "input": "x", "questions": [question]}).json()
    assert [p["value"] for p in body["answers"][0]["probabilities"]] == values


def test_duplicate_and_untyped_choice_values_are_400(stack: Stack) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        create(stack, questions=[{"type": "choice", "instructions": "?", "choices": [{"value": "a"}, {"value": "a"}]}])
    assert info.value.param == "questions[0].choices[1].value" and info.value.code == "duplicate_value"
    for value in (1, 1.5, None, ["a"], {"a": 1}):
        body = {"model": "nimble", "input": "x", "questions": [
            {"type": "choice", "instructions": "?", "choices": [{"value": "a"}, {"value": value}]}]}
        error = openai_error(raw(stack, body), 400, "invalid_request_error", "questions[0].choices[1].value")
        assert error["code"] == "invalid_type"
    assert sent(stack.ollama_state, "/v1/systemone") == []


def test_input_messages_and_text_parts_are_one_state(stack: Stack) -> None:
    messages = [{"role": "user", "content": "Part one."},
                {"type": "message", "role": "user",
                 "content": [{"type": "input_text", "text": "Part two."},
                             {"type": "input_text", "text": "Part three.",
                              "prompt_cache_breakpoint": {"mode": "explicit"}}]}]
    from_messages = create(stack, input=messages)
    # Messages apart by a blank line, a message's parts by "\n", as vLLM's adapters.input_text.
    from_text = create(stack, input="Part one.\n\nPart two.\nPart three.")
    states = [r["state"] for r in sent(stack.ollama_state, "/v1/systemone")]
    assert states == ["Part one.\n\nPart two.\nPart three."] * 2
    assert from_messages.answers == from_text.answers
    parts = [{"type": "input_text", "text": "Which"}, {"type": "input_text", "text": "team?"}]
    create(stack, questions=[{"type": "predicate", "instructions": parts}])
    assert sent(stack.ollama_state, "/v1/systemone")[-1]["questions"]["questions[0]"]["instructions"] == "Which\nteam?"


# Instructions and descriptions of any JSON kind (SPEC §1), as TypeSafe's clients send them.
STRUCTURED_QUESTIONS: list[dict[str, Any]] = [
    {"type": "predicate", "name": "damaged", "instructions": {"ask": "Damaged?", "parts": ["screen"]}},
    {"type": "choice", "name": "team", "instructions": ["route", 1],
     "choices": [{"value": "returns", "description": {"covers": ["refunds", True]}}, {"value": "billing",
                                                                                     "description": 0}]},
    {"type": "score", "name": "tone", "instructions": 7,
     "levels": [{"label": "calm", "description": {"max": 1}}, {"label": "furious", "description": ""}]},
]


def test_structured_instructions_and_descriptions_are_asked_as_compact_json(stack: Stack) -> None:
    decision = raw(stack, {"model": "nimble", "input": TICKET, "questions": STRUCTURED_QUESTIONS})
    assert decision.status_code == 200, decision.text
    assert [a["name"] for a in decision.json()["answers"]] == ["damaged", "team", "tone"]
    [asked] = sent(stack.ollama_state, "/v1/systemone")
    assert asked["questions"] == {
        "damaged": {"type": "noul", "instructions": '{"ask":"Damaged?","parts":["screen"]}'},
        "team": {"type": "choice", "instructions": '["route",1]',
                 "criteria": {"returns": '{"covers":["refunds",true]}', "billing": "0"}},
        "tone": {"type": "score", "instructions": "7", "criteria": ['calm: {"max":1}', "furious"]}}
    missing = raw(stack, {"model": "nimble", "input": TICKET,
                          "questions": [{"type": "predicate", "instructions": None}]})
    openai_error(missing, 400, "invalid_request_error", "questions[0].instructions")  # null: left out


def test_vllm_takes_structured_text_as_compact_json(vllm_stack: Stack) -> None:
    """vLLM 0.33's DecisionRequest takes strings only: a structured value goes as its JSON text."""
    response = raw(vllm_stack, {"model": QWEN, "input": TICKET, "questions": STRUCTURED_QUESTIONS})
    assert response.status_code == 200, response.text
    [forwarded] = sent(vllm_stack.extra["state"], "/v1/decisions")
    assert [q["instructions"] for q in forwarded["questions"]] == [
        '{"ask":"Damaged?","parts":["screen"]}', '["route",1]', "7"]
    assert forwarded["questions"][1]["choices"] == [
        {"value": "returns", "description": '{"covers":["refunds",true]}'}, {"value": "billing", "description": "0"}]
    assert forwarded["questions"][2]["levels"] == [{"label": "calm", "description": '{"max":1}'},
                                                   {"label": "furious", "description": ""}]


def test_repeated_names_are_echoed_and_kept_apart(stack: Stack) -> None:
    questions = [{"type": "predicate", "name": "same", "instructions": f"Is it {n}?"} for n in range(3)]
    decision = create(stack, questions=questions)
    assert [a.name for a in decision.answers] == ["same"] * 3
    asked = sent(stack.ollama_state, "/v1/systemone")[-1]["questions"]
    assert list(asked) == ["questions[0]", "questions[1]", "questions[2]"]


# -- forwarded straight to vLLM --------------------------------------------------------------


def test_vllm_gets_the_request_straight(vllm_stack: Stack) -> None:
    state = vllm_stack.extra["state"]
    decision = create(vllm_stack, QWEN, safety_identifier="end-user-7", prompt_cache_key="tickets")
    assert decision.model == QWEN
    check_answers(decision, ["damaged", "department", None], ["returns", "billing"])
    assert sent(state, "/v1/systemone") == []
    [forwarded] = sent(state, "/v1/decisions")
    salt = forwarded.pop("cache_salt")  # the project's prefix-cache salt, as /v1/systemone gets it
    assert isinstance(salt, str) and len(salt) == 64
    # vLLM 0.33's DecisionRequest forbids prompt_cache_key: it is left out (the salt keeps the
    # project's prefixes its own), the rest goes as it came.
    assert forwarded == {"model": QWEN, "input": TICKET, "questions": QUESTIONS,
                         "safety_identifier": "end-user-7"}
    # Nothing of vLLM's answer is dropped: vLLM 0.33's DecisionResponse is model, answers, usage.
    body = raw(vllm_stack, {"model": QWEN, "input": TICKET, "questions": QUESTIONS}).json()
    assert set(body) == {"model", "answers", "usage"}
    assert set(body["usage"]) == {"input_tokens", "input_tokens_details", "output_tokens",
                                  "output_tokens_details", "total_tokens"}


def test_vllm_typed_values_and_the_same_shape_as_translated(vllm_stack: Stack, ollama: Any) -> None:
    values = [True, "true", False]
    question = {"type": "choice", "instructions": "Which one?", "choices": [{"value": v} for v in values]}
    choice = create(vllm_stack, QWEN, questions=[question]).answers[0]
    got = [p.value for p in choice.probabilities]
    assert got == values and [type(v) for v in got] == [bool, str, bool]
    best = max(choice.probabilities, key=lambda p: p.probability).value
    assert choice.choice == best and type(choice.choice) is type(best)
    with vllm_stack.client("admin") as admin:  # the same request through Ollama: the same shape
        assert admin.post("/admin/services", json={"type": "ollama-external", "url": ollama[0].url,
                                                   "name": "ollama"}).status_code in (200, 201)
    translated = raw(vllm_stack, {"model": "nimble", "input": TICKET, "questions": QUESTIONS})
    forwarded = raw(vllm_stack, {"model": QWEN, "input": TICKET, "questions": QUESTIONS})
    assert translated.status_code == forwarded.status_code == 200, translated.text

    def shape(body: dict[str, Any]) -> list[Any]:
        return [sorted(a) for a in body["answers"]] + [sorted(body["usage"])]

    assert shape(translated.json()) == shape(forwarded.json())


def test_vllm_cache_salt_is_per_project(vllm_stack: Stack) -> None:
    other = vllm_stack.new_project("globex")
    create(vllm_stack, QWEN)
    create(vllm_stack, QWEN)
    sdk(vllm_stack, other).decisions.create(model=QWEN, input=TICKET, questions=QUESTIONS)
    salts = [r["cache_salt"] for r in sent(vllm_stack.extra["state"], "/v1/decisions")]
    assert salts[0] == salts[1] != salts[2]


def test_a_vllm_error_keeps_its_status_and_message(vllm_stack: Stack) -> None:
    many = {"type": "choice", "instructions": "?", "choices": [{"value": f"o{i}"} for i in range(27)]}
    with pytest.raises(openai.BadRequestError) as info:
        create(vllm_stack, QWEN, questions=[many])  # 27 is within Arbiter's 255, over vLLM's 26 labels
    # vLLM 0.33's own words (openai/decisions/adapters.py make_read_question), as it sent them.
    assert "This model supports at most 26 choices per question" in info.value.message
    assert info.value.status_code == 400
    # A model without any read strategy: /v1/decisions is a 501, and so is the /v1/systemone the
    # request is then translated onto; that 501 comes back as vLLM sent it.
    vllm_stack.extra["state"].models[QWEN]["read_strategy"] = False
    response = raw(vllm_stack, {"model": QWEN, "input": TICKET, "questions": QUESTIONS})
    assert response.status_code == 501
    assert [r.path for r in vllm_stack.extra["state"].requests[-2:]] == ["/v1/decisions", "/v1/systemone"]


def test_a_501_from_vllms_decisions_route_is_translated_onto_systemone(vllm_stack: Stack) -> None:
    """vLLM always registers /v1/decisions; a model whose read strategy is not a generate task
    (D3, Clef) answers 501 there while its /v1/systemone works (openai/decisions/state.py)."""
    state = vllm_stack.extra["state"]
    state.models[QWEN]["instructions"] = False  # a fixed-prompt model, as vLLM's D3Strategy
    decision = create(vllm_stack, QWEN)
    assert decision.model == QWEN
    check_answers(decision, ["damaged", "department", None], ["returns", "billing"])
    assert [r.path for r in state.requests[-2:]] == ["/v1/decisions", "/v1/systemone"]


def test_a_vllm_without_the_route_is_translated(vllm_stack: Stack) -> None:
    state = vllm_stack.extra["state"]
    state.openai_decisions = False
    decision = create(vllm_stack, QWEN)
    check_answers(decision, ["damaged", "department", None], ["returns", "billing"])
    assert len(sent(state, "/v1/systemone")) == 1
    assert len(sent(state, "/v1/decisions")) == 1  # tried first: FastAPI's 404 for the route


def test_traces_carry_usage_and_the_input_as_state(stack: Stack, gateway_factory: Any) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    gateway = gateway_factory(tracer_provider=provider)
    decision = OpenAI(base_url=gateway.url + "/v1", api_key=stack.project_key, max_retries=0).decisions.create(
        model="nimble", input=TICKET, questions=QUESTIONS)
    (client_span,) = [s for s in exporter.get_finished_spans() if s.name.startswith("decision ")]
    attributes = client_span.attributes or {}
    assert client_span.name == "decision nimble" and attributes["gen_ai.operation.name"] == "decision"
    assert attributes["gen_ai.usage.input_tokens"] == decision.usage.input_tokens
    assert attributes["body.state"] == TICKET
    traceparent = [r for r in stack.ollama_state.requests if r.path == "/v1/systemone"][-1].header("traceparent")
    assert int(traceparent.split("-")[1], 16) == client_span.context.trace_id


def test_usage_metrics_and_the_ledger(stack: Stack) -> None:
    decision = create(stack)
    with pytest.raises(openai.NotFoundError):
        create(stack, "ghost")
    with stack.client("admin") as admin:
        metrics = {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
                   for family in text_string_to_metric_families(admin.get("/metrics").text)
                   for sample in family.samples}
    tokens = tuple(sorted({"gen_ai_operation_name": "decision", "gen_ai_provider_name": "ollama",
                           "gen_ai_token_type": "input", "gen_ai_request_model": "nimble",
                           "project": "acme"}.items()))
    assert metrics[("gen_ai_client_token_usage_sum", tokens)] == decision.usage.input_tokens
    for status in ("200", "404"):
        labels = (("method", "POST"), ("route", "/v1/decisions"), ("status", status))
        assert metrics[("arbiter_http_requests_total", labels)] == 1
    stack.gateway.stop()  # flushes the ledger
    with stack.db.session() as session:
        rows = [(r.operation, r.model, r.status, r.input_tokens, r.output_tokens)
                for r in session.scalars(select(UsageRecord).order_by(UsageRecord.id))]
    assert rows[0] == ("decision", "nimble", 200, decision.usage.input_tokens, 3)
    assert [(r[0], r[2], r[3]) for r in rows[1:]] == [("decision", 404, 0)]
