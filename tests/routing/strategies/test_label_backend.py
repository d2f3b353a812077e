"""`read_strategy: labels` end to end through /v1/systemone: a generation model answers decisions
by label reading, over vLLM (token ids from its /tokenize, its extras, the project's cache salt)
and over an Ollama too old for decision models (no version gate: it needs no /v1/systemone)."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from app.db.session import Database
from app.tenancy.salts import TenantSalts
from infra_adapters.emulators.answers import count_tokens, distribution
from infra_adapters.emulators.generation import message_text
from infra_adapters.emulators.logprobs_chat import token_id
from infra_adapters.emulators.ollama_state import OllamaState
from infra_adapters.emulators.server import EmulatorServer
from infra_adapters.emulators.vllm import VllmState
from tests.api.public.openai_sdk import QUESTIONS
from tests.support import Gateway, Stack, assert_error, decision

QWEN = "Qwen/Qwen3-0.6B"


def _model_id(stack: Stack, name: str) -> int:
    models = stack.client("admin").get("/admin/models").json()["data"]
    return int(next(m["id"] for m in models if m["public_name"] == name))


def _labels_on(stack: Stack, name: str) -> dict[str, Any]:
    response = stack.client("admin").patch(f"/admin/models/{_model_id(stack, name)}",
                                           json={"read_strategy": "labels"})
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def _check_answer(answer: dict[str, Any], label_mass: float) -> None:
    assert list(answer["answers"]) == ["team", "urgent", "tone"]  # question order kept
    for qid, item in answer["answers"].items():
        assert math.isclose(sum(item["probabilities"].values()), 1.0, rel_tol=1e-9), qid
        assert 0.0 <= item["confidence"] <= 1.0
        assert math.isclose(answer["diagnostics"][qid]["label_mass"], label_mass, rel_tol=1e-6)
    team = answer["answers"]["team"]
    assert team["choice"] == max(team["probabilities"], key=team["probabilities"].get)
    assert set(team["probabilities"]) == {"billing", "shipping"}
    tone = answer["answers"]["tone"]
    assert math.isclose(tone["score"], sum(int(k) * p for k, p in tone["probabilities"].items()))
    assert answer["usage"]["output_tokens"] == 3 and answer["usage"]["input_tokens"] > 0


def test_a_vllm_generation_model_answers_by_label_reading(vllm_stack: Stack) -> None:
    state: VllmState = vllm_stack.extra["state"]
    view = _labels_on(vllm_stack, QWEN)
    assert view["read_strategy"] == "labels" and "decision" in view["capabilities"]
    before = len(state.requests)
    response = vllm_stack.client().post("/v1/systemone", json=decision(QWEN))
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["model"] == QWEN
    _check_answer(answer, state.label_mass)

    sent = state.requests[before:]
    assert "/v1/systemone" not in [r.path for r in sent]  # read by labels, not by the backend's route
    tokenize = [r.json for r in sent if r.path == "/tokenize"]
    # vLLM's way first (a probe chat up to the generation prompt, as its reply_label_ids); the
    # emulator cannot render chats, so each label's spellings are tokenized instead.
    assert tokenize[0]["messages"] == [{"role": "user", "content": "x"}] and tokenize[0]["add_generation_prompt"]
    tokenized = [r.get("prompt") for r in tokenize[1:]]
    assert "A" in tokenized and "yes" in tokenized and "0" in tokenized
    reads = [r.json for r in sent if r.path == "/v1/chat/completions"]
    assert len(reads) == 3
    salt = TenantSalts(vllm_stack.gateway.settings).of(_project_id(vllm_stack))
    for read in reads:
        assert read["max_tokens"] == 1 and read["temperature"] == 0 and read["top_logprobs"] == 20
        assert read["continue_final_message"] is False and read["add_generation_prompt"] is True
        assert read["chat_template_kwargs"] == {"enable_thinking": False}
        assert read["messages"][0]["content"].startswith('{"ticket": "My card was charged twice."}\n\nQuestion: ')
        assert [m["role"] for m in read["messages"]] == ["user"]  # the reply is the model's: no prefill
        assert read["cache_salt"] == salt and read["return_tokens_as_token_ids"] is True
        assert "allowed_token_ids" not in read  # no mask: the sampled token is the true argmax
    choice = next(r for r in reads
                  if "\nA: billing - payments and refunds\nB: shipping\n" in r["messages"][0]["content"])
    both = [token_id("A"), token_id(" A"), token_id("B"), token_id(" B")]  # each label, then its " X" spelling
    assert choice["logprob_token_ids"] == both

    # The tokenizer is read once per model: a second request asks for no token ids.
    again = len(state.requests)
    assert vllm_stack.client().post("/v1/systemone", json=decision(QWEN)).status_code == 200
    assert [r.path for r in state.requests[again:]].count("/tokenize") == 0


def test_leading_space_labels_count_in_full_whatever_their_rank(vllm_stack: Stack) -> None:
    # After "Answer:" a BPE model puts most of a label's weight on " X"; with 24 options most of
    # those fall out of the top 20 logprobs, yet each must count towards its label.
    state: VllmState = vllm_stack.extra["state"]
    _labels_on(vllm_stack, QWEN)
    state.label_space_share, state.label_mass = 0.9, 0.95
    body = decision(QWEN, questions={"team": {"type": "choice", "instructions": "Which team?",
                                              "criteria": {f"team{i}": None for i in range(24)}}})
    response = vllm_stack.client().post("/v1/systemone", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    (read,) = [r.json for r in state.requests if r.path == "/v1/chat/completions"]
    prompt = read["messages"][0]["content"]
    names = [chr(ord("A") + i) for i in range(24)]
    truth = distribution(prompt, "choice", None, names).probs
    assert list(answer["answers"]["team"]["probabilities"].values()) == pytest.approx(truth)
    assert answer["diagnostics"]["team"]["label_mass"] == pytest.approx(0.95)
    assert answer["answers"]["team"]["confidence"] == pytest.approx(max(truth) * 0.95)


def _project_id(stack: Stack) -> int:
    return int(stack.client("admin").get("/admin/projects/acme").json()["id"])


def test_the_callers_own_cache_salt_is_combined_into_every_read(vllm_stack: Stack) -> None:
    state: VllmState = vllm_stack.extra["state"]
    _labels_on(vllm_stack, QWEN)
    tenant = TenantSalts(vllm_stack.gateway.settings).of(_project_id(vllm_stack))
    for own in ("end-user-42", "end-user-43"):
        before = len(state.requests)
        response = vllm_stack.client().post("/v1/systemone", json=decision(QWEN, cache_salt=own))
        assert response.status_code == 200, response.text
        reads = [r.json for r in state.requests[before:] if r.path == "/v1/chat/completions"]
        assert len(reads) == 3
        # As /v1/systemone sends it to vLLM: one tenant's users do not share a prefix cache either.
        assert {r["cache_salt"] for r in reads} == {hashlib.sha256(f"{tenant}:{own}".encode()).hexdigest()}


def test_thinking_stays_off_and_turning_it_on_is_a_400(vllm_stack: Stack) -> None:
    state: VllmState = vllm_stack.extra["state"]
    _labels_on(vllm_stack, QWEN)
    before = len(state.requests)
    thinking = vllm_stack.client().post("/v1/systemone", json=decision(
        QWEN, chat_template_kwargs={"enable_thinking": True}))
    assert_error(thinking, 400, "invalid_request_error")
    assert "enable_thinking" in thinking.json()["error"] and "first token" in thinking.json()["error"]
    assert "/v1/chat/completions" not in [r.path for r in state.requests[before:]]  # refused before any read
    off = vllm_stack.client().post("/v1/systemone", json=decision(
        QWEN, chat_template_kwargs={"enable_thinking": False, "custom": 1}))
    assert off.status_code == 200, off.text
    reads = [r.json for r in state.requests[before:] if r.path == "/v1/chat/completions"]
    # The request's other kwargs go along, as vLLM merges them; thinking stays off.
    assert len(reads) == 3 and all(r["chat_template_kwargs"] == {"enable_thinking": False, "custom": 1}
                                   for r in reads)


def _cached(state: VllmState, reads: int) -> int:
    """What the emulator's prefix cache holds of the last ``reads`` reads: every token, when each
    was read before under the same salt."""
    sent = [r.json for r in state.requests if r.path == "/v1/chat/completions"][-reads:]
    return sum(count_tokens("".join(message_text(m["content"]) for m in r["messages"])) for r in sent)


def test_prefix_cache_hits_are_counted_and_kept_per_salt(vllm_stack: Stack) -> None:
    state: VllmState = vllm_stack.extra["state"]
    state.prefix_caching = True
    _labels_on(vllm_stack, QWEN)
    body = decision(QWEN, questions={"urgent": {"type": "noul", "instructions": "Reply within the hour?"}})
    first = vllm_stack.client().post("/v1/systemone", json=body)
    assert first.status_code == 200, first.text
    assert first.json()["usage"]["input_tokens_details"] == {"cached_tokens": 0}
    again = vllm_stack.client().post("/v1/systemone", json=body).json()["usage"]
    assert again["input_tokens_details"] == {"cached_tokens": _cached(state, 1)} and _cached(state, 1) > 0
    # The OpenAI Decisions API reports them as its cached_tokens.
    openai = {"model": QWEN, "input": "My card was charged twice.", "questions": QUESTIONS}
    assert vllm_stack.client().post("/v1/decisions", json=openai).status_code == 200
    usage = vllm_stack.client().post("/v1/decisions", json=openai).json()["usage"]
    assert usage["input_tokens_details"]["cached_tokens"] == _cached(state, 3) > 0
    # Another project's reads are salted apart: nothing of the first project's is a hit for it.
    other = vllm_stack.new_project("other")
    with vllm_stack.client(other) as client:
        assert client.post("/v1/systemone", json=body).json()["usage"]["input_tokens_details"] == {
            "cached_tokens": 0}


def test_what_labels_cannot_read_is_a_400(vllm_stack: Stack) -> None:
    _labels_on(vllm_stack, QWEN)
    many = decision(QWEN)
    many["questions"] = {"team": {"type": "choice", "criteria": {f"team{i}": None for i in range(27)}}}
    response = vllm_stack.client().post("/v1/systemone", json=many)
    assert_error(response, 400, "invalid_request_error")
    assert "at most 26 options" in response.json()["error"]


def test_label_reading_needs_a_generation_model(vllm_stack: Stack, db: Database) -> None:
    admin = vllm_stack.client("admin")
    custom = admin.post("/admin/services/vllm/models", json={"model": QWEN, "public_name": "qwen-embed",
                                                           "capabilities": ["embedding"]})
    assert custom.status_code == 201, custom.text
    response = admin.patch(f"/admin/models/{_model_id(vllm_stack, 'qwen-embed')}", json={"read_strategy": "labels"})
    assert_error(response, 400, "invalid_request_error")
    assert "completion capability" in response.json()["error"]
    bad = admin.patch(f"/admin/models/{_model_id(vllm_stack, 'qwen-embed')}", json={"read_strategy": "tea-leaves"})
    assert bad.status_code == 400


def test_an_ollama_too_old_for_decision_models_answers_through_labels(
        db: Database, ollama: tuple[EmulatorServer, OllamaState], gateway_factory: Callable[..., Gateway]) -> None:
    server, state = ollama
    state.version = "0.34.0"
    stack = Stack.provision(db, ollama_url=server.url)
    stack.gateway = gateway_factory()
    assert_error(stack.client().post("/v1/systemone", json=decision("llama3.2")), 400, "invalid_request_error")
    view = _labels_on(stack, "llama3.2")
    assert "decision" in view["capabilities"]
    before = len(state.requests)
    response = stack.client().post("/v1/systemone", json=decision("llama3.2"))
    assert response.status_code == 200, response.text
    _check_answer(response.json(), state.label_mass)
    reads = [r.json for r in state.requests[before:] if r.path == "/v1/chat/completions"]
    assert len(reads) == 3 and all("logprob_token_ids" not in r and "cache_salt" not in r for r in reads)
    # Thinking off in Ollama's words: its openai/openai.go reads reasoning_effort "none" as think false
    # (thinking models think by default, and the one token read would be reasoning).
    assert all(r["reasoning_effort"] == "none" and "chat_template_kwargs" not in r for r in reads)
    # Turned off again, it is a chat model once more.
    off = stack.client("admin").patch(f"/admin/models/{_model_id(stack, 'llama3.2')}", json={"read_strategy": None})
    assert off.status_code == 200 and off.json()["read_strategy"] is None
    assert_error(stack.client().post("/v1/systemone", json=decision("llama3.2")), 400, "invalid_request_error")


def test_an_openai_compatible_server_serves_decisions_and_chat(
        db: Database, vllm: tuple[EmulatorServer, VllmState], gateway_factory: Callable[..., Gateway]) -> None:
    server, state = vllm  # as an OpenAI-compatible server: /v1/models and /v1/chat/completions only
    stack = Stack.provision(db)
    stack.gateway = gateway_factory()
    added = stack.client("admin").post("/admin/services", json={"type": "openai", "url": server.url,
                                                                 "name": "llama-server"})
    assert added.status_code == 201, added.text
    (card,) = stack.client("admin").get("/admin/models").json()["data"]
    assert card["public_name"] == QWEN and card["read_strategy"] == "labels"
    assert set(card["capabilities"]) == {"completion", "decision"}
    before = len(state.requests)
    response = stack.client().post("/v1/systemone", json=decision(QWEN))
    assert response.status_code == 200, response.text
    _check_answer(response.json(), state.label_mass)
    paths = [r.path for r in state.requests[before:]]
    assert set(paths) == {"/v1/chat/completions"} and len(paths) == 3
    chat = stack.client().post("/v1/chat/completions",
                               json={"model": QWEN, "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 200, chat.text
    off = stack.client("admin").patch(f"/admin/models/{card['id']}", json={"read_strategy": None})
    assert_error(off, 400, "invalid_request_error")


def test_the_backends_own_answers_to_reads_are_judged_as_any_backends(vllm_stack: Stack) -> None:
    state: VllmState = vllm_stack.extra["state"]
    _labels_on(vllm_stack, QWEN)
    assert vllm_stack.client().post("/v1/systemone", json=decision(QWEN)).status_code == 200  # token ids known
    # A 400 of the backend (say, a prompt over its context) passes through and takes nothing out.
    state.faults.status, state.faults.body = 400, b'{"error": {"message": "too long", "code": 400}}'
    response = vllm_stack.client().post("/v1/systemone", json=decision(QWEN))
    assert response.status_code == 400 and response.content == b'{"error": {"message": "too long", "code": 400}}'
    # A 401 from a service Arbiter sends no key to passes through as it came (with a key: 500).
    state.faults.status, state.faults.body = 401, b'{"error": "Unauthorized"}'
    response = vllm_stack.client().post("/v1/systemone", json=decision(QWEN))
    assert response.status_code == 401 and response.content == b'{"error": "Unauthorized"}'
    state.faults.reset()
    assert vllm_stack.client().post("/v1/systemone", json=decision(QWEN)).status_code == 200
    # A 503 takes the replica out for its back-off, as for any backend.
    state.faults.status, state.faults.body = 503, b'{"error": "busy"}'
    assert vllm_stack.client().post("/v1/systemone", json=decision(QWEN)).status_code == 503
    state.faults.reset()
    assert_error(vllm_stack.client().post("/v1/systemone", json=decision(QWEN)), 503, "backend_error")


def _chat_answer(logprobs: Any) -> bytes:
    return orjson.dumps({"id": "chatcmpl-1", "object": "chat.completion", "model": QWEN,
                         "choices": [{"index": 0, "message": {"role": "assistant", "content": "yes"},
                                      "logprobs": logprobs, "finish_reason": "length"}],
                         "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}})


def test_a_200_without_logprobs_is_a_502_that_takes_nothing_out(vllm_stack: Stack) -> None:
    state: VllmState = vllm_stack.extra["state"]
    _labels_on(vllm_stack, QWEN)
    assert vllm_stack.client().post("/v1/systemone", json=decision(QWEN)).status_code == 200  # token ids known
    # A server that ignores `logprobs` (null), or answers them empty: the backend is up, the answer unusable.
    for logprobs in (None, {"content": []}):
        state.faults.status, state.faults.body = 200, _chat_answer(logprobs)
        response = vllm_stack.client().post("/v1/systemone", json=decision(QWEN))
        assert_error(response, 502, "backend_error")
        assert "no logprobs" in response.json()["error"] and "label reading needs them" in response.json()["error"]
        state.faults.reset()
        assert vllm_stack.client().post("/v1/systemone", json=decision(QWEN)).status_code == 200  # not backed off
    state.faults.status, state.faults.body = 200, _chat_answer(None)
    openai = vllm_stack.client().post("/v1/decisions", json={"model": QWEN, "input": "x", "questions": QUESTIONS})
    assert openai.status_code == 502 and "no logprobs" in openai.json()["error"]["message"]
    state.faults.reset()
    assert vllm_stack.client().post("/v1/decisions", json={"model": QWEN, "input": "x",
                                                           "questions": QUESTIONS}).status_code == 200


def test_media_and_the_openai_decisions_api_on_a_label_read_model(vllm_stack: Stack) -> None:
    state: VllmState = vllm_stack.extra["state"]
    _labels_on(vllm_stack, QWEN)
    with_image = decision(QWEN, images=["aGVsbG8="])
    response = vllm_stack.client().post("/v1/systemone", json=with_image)
    # Refused either by the capability check (no vision) or by label reading (text only): never ignored.
    assert_error(response, 400, "invalid_request_error")
    before = len(state.requests)
    body = {"model": QWEN, "input": "My card was charged twice.", "questions": QUESTIONS}
    answer = vllm_stack.client().post("/v1/decisions", json=body)
    assert answer.status_code == 200, answer.text
    assert [a["name"] for a in answer.json()["answers"]] == ["damaged", "department", None]
    paths = [r.path for r in state.requests[before:]]
    assert "/v1/decisions" not in paths and paths.count("/v1/chat/completions") == 3


STRUCTURED = decision(questions={
    "team": {"type": "choice", "instructions": {"ask": "Which team?", "ids": [1, 2.50]},
             "criteria": {"billing": ["refunds", True], "shipping": None}},
    "urgent": {"type": "noul", "instructions": None, "criteria": {"true": {"within": "1h"}}},
})


def _structured(model: str) -> bytes:
    """The body as a client writes it: ``2.50`` stays ``2.50`` (numbers keep their text)."""
    return orjson.dumps({**STRUCTURED, "model": model}).replace(b"2.5]", b"2.50]")


def _user_messages(requests: list[Any]) -> list[str]:
    return sorted(r.json["messages"][-1]["content"] for r in requests if r.path == "/v1/chat/completions")


def test_structured_text_is_read_on_vllm_as_vllm_writes_it(vllm_stack: Stack) -> None:
    """vLLM's own reader writes a non-string with Python's ``str()`` (question_types.py), so its
    label reads do too: one model answers the same through both."""
    state: VllmState = vllm_stack.extra["state"]
    _labels_on(vllm_stack, QWEN)
    before = len(state.requests)
    response = vllm_stack.client().post("/v1/systemone", content=_structured(QWEN),
                                       headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text
    ticket = '{"ticket": "My card was charged twice."}'
    assert _user_messages(state.requests[before:]) == [
        (f"{ticket}\n\nQuestion: {{'ask': 'Which team?', 'ids': [1, 2.5]}}\nA: billing - ['refunds', True]\n"
         "B: shipping\nAnswer with the letter of one option only."),
        f"{ticket}\n\nyes: {{'within': '1h'}}\nno\nAnswer with yes or no only.",
    ]


def test_structured_text_is_read_elsewhere_as_compact_json(
        db: Database, ollama: tuple[EmulatorServer, OllamaState], gateway_factory: Callable[..., Gateway]) -> None:
    server, state = ollama
    state.version = "0.34.0"
    stack = Stack.provision(db, ollama_url=server.url)
    stack.gateway = gateway_factory()
    _labels_on(stack, "llama3.2")
    before = len(state.requests)
    response = stack.client().post("/v1/systemone", content=_structured("llama3.2"),
                                       headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text
    ticket = '{"ticket": "My card was charged twice."}'  # the state as vLLM's state_text writes it
    assert _user_messages(state.requests[before:]) == [
        (f'{ticket}\n\nQuestion: {{"ask":"Which team?","ids":[1,2.50]}}\nA: billing - ["refunds",true]\n'
         "B: shipping\nAnswer with the letter of one option only."),
        f'{ticket}\n\nyes: {{"within":"1h"}}\nno\nAnswer with yes or no only.',
    ]
