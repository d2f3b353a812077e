"""Arbiter in front of vLLM 0.33.0's real front end (its own routers, validation, serving classes
and NextTokenStrategy; the engine stubbed: ``vllm_frontend.py``), over real HTTP on loopback.

Each test that does not need to look inside the backend runs twice: against the vLLM emulator
(``infra_adapters/emulators/vllm.py``) and against the real front end, so a divergence between
the two shows up as one case passing and the other failing. The real cases need
``ARBITER_CONTRACT_PYTHON`` (``scripts/bootstrap-contract``); without it they skip.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from app.db.session import Database
from infra_adapters.emulators.server import EmulatorServer
from infra_adapters.emulators.vllm import VllmState, make_vllm_app
from tests.contract.conftest import MODEL, Frontend
from tests.support import Gateway, Stack, assert_error, body, decision, synced


@dataclass
class Target:
    """Arbiter with one ``vllm`` service in front of ``backend_url``."""

    kind: str  # "emulator" or a flavour of the real front end
    stack: Stack
    backend_url: str

    def client(self, key: str | None = "project") -> httpx.Client:
        return self.stack.client(key)

    def native(self, path: str, payload: dict[str, Any]) -> httpx.Response:
        """``payload`` sent to the backend itself, not through Arbiter."""
        return httpx.post(self.backend_url + path, json=payload, timeout=30)

    def labels_on(self) -> None:
        admin = self.client("admin")
        models = body(admin.get("/admin/models"), 200)
        entry = next(m for m in (models["data"] if isinstance(models, dict) else models)
                     if m["public_name"] == MODEL)
        body(admin.patch(f"/admin/models/{entry['id']}", json={"read_strategy": "labels"}), 200)


def _target(kind: str, url: str, db: Database, gateway_factory: Callable[..., Gateway]) -> Target:
    stack = Stack.provision(db, vllm_url=url)
    stack.gateway = synced(gateway_factory())
    return Target(kind, stack, url)


@pytest.fixture
def emulator_target(db: Database, gateway_factory: Callable[..., Gateway]) -> Iterator[Target]:
    state = VllmState(version="0.33.0", models={MODEL: {"read_strategy": True, "max_model_len": 8192}})
    with EmulatorServer(make_vllm_app(state)) as server:
        yield _target("emulator", server.url, db, gateway_factory)


@pytest.fixture(params=["emulator", "plain"])
def target(request: pytest.FixtureRequest, db: Database, gateway_factory: Callable[..., Gateway]) -> Target:
    """The emulator, then the real front end."""
    if request.param == "emulator":
        return request.getfixturevalue("emulator_target")  # type: ignore[no-any-return]
    return _real(request, "plain", db, gateway_factory)


def _real(request: pytest.FixtureRequest, flavour: str, db: Database,
          gateway_factory: Callable[..., Gateway]) -> Target:
    frontends: dict[str, Frontend] = request.getfixturevalue("vllm_frontends")
    return _target(flavour, frontends[flavour].url, db, gateway_factory)


@pytest.fixture(params=["plain", "token-ids", "processed"])
def real_target(request: pytest.FixtureRequest, db: Database, gateway_factory: Callable[..., Gateway]) -> Target:
    """The real front end: as started by default, with ``--return-tokens-as-token-ids``, and with
    ``--logprobs-mode processed_logprobs``."""
    return _real(request, request.param, db, gateway_factory)


def _probabilities_sum_to_one(answer: dict[str, Any]) -> None:
    probs = answer["probabilities"]
    values = [p["probability"] for p in probs] if isinstance(probs, list) else list(probs.values())
    assert math.isclose(math.fsum(values), 1.0, rel_tol=1e-9), answer


# -- /v1/systemone forwarded ---------------------------------------------------------------


SEED = decision(MODEL, keep_alive="5m")  # SPEC §1's example; keep_alive is Ollama's, never sent to vLLM


def test_sync_lists_the_model_with_its_capabilities(target: Target) -> None:
    listed = body(target.client().get("/v1/models"), 200)
    entry = next(m for m in listed["data"] if m["id"] == MODEL)
    assert {"decision", "completion"} <= set(entry["capabilities"])


def test_the_seed_example_answers_in_question_order(target: Target) -> None:
    answer = body(target.client().post("/v1/systemone", json=SEED), 200)
    assert answer["model"] == MODEL
    assert list(answer["answers"]) == ["team", "urgent", "tone"]
    assert answer["answers"]["team"]["choice"] in ("billing", "shipping")
    for qid in ("team", "tone"):
        _probabilities_sum_to_one(answer["answers"][qid])
    assert 0.0 <= answer["answers"]["urgent"]["noul"] <= 1.0
    assert set(answer["diagnostics"]) == {"team", "urgent", "tone"}  # vLLM's fields pass through
    assert answer["usage"]["input_tokens"] > 0 and answer["usage"]["output_tokens"] == 3


def test_an_unknown_field_gets_vllms_own_400_unchanged(target: Target) -> None:
    """Arbiter passes unknown fields on (SPEC §1); vLLM 0.33 refuses them (``extra="forbid"``) and
    its 400 comes back as it came."""
    response = target.client().post("/v1/systemone", json=decision(MODEL, verbosity="high"))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "body.verbosity" and error["code"] == 400 and error["type"] == "Bad Request"
    assert "extra_forbidden" in error["message"]


def test_a_question_field_vllm_does_not_know_gets_its_400(target: Target) -> None:
    request = decision(MODEL)
    request["questions"]["team"]["weight"] = 2
    response = target.client().post("/v1/systemone", json=request)
    assert response.status_code == 400, response.text
    assert "weight" in response.json()["error"]["message"]


def test_thinking_on_is_vllms_400(target: Target) -> None:
    response = target.client().post("/v1/systemone",
                                    json=decision(MODEL, chat_template_kwargs={"enable_thinking": True}))
    assert response.status_code == 400, response.text
    assert "thinking must be off" in response.json()["error"]["message"]


def test_a_callers_cache_salt_and_instructions_are_taken(target: Target) -> None:
    answer = body(target.client().post("/v1/systemone", json=decision(
        MODEL, cache_salt="my-own-salt", instructions="You triage support tickets.")), 200)
    assert list(answer["answers"]) == ["team", "urgent", "tone"]


# Instructions and descriptions of any JSON kind (SPEC §1), as TypeSafe's SDK sends them.
STRUCTURED = decision(MODEL, questions={
    "team": {"type": "choice", "instructions": {"ask": "Which team?", "ids": [1, 2.5]},
             "criteria": {"billing": {"covers": ["refunds", True]}, "shipping": None, "legal": 0}},
    "urgent": {"type": "noul", "instructions": ["within", "the", "hour"],
               "criteria": {"true": {"n": 1}, "false": False}},
    "tone": {"type": "score", "instructions": 7, "criteria": [{"calm": None}, "annoyed", 3.5]},
})


def test_structured_instructions_and_criteria_answer_200(target: Target) -> None:
    answer = body(target.client().post("/v1/systemone", json=STRUCTURED), 200)
    assert list(answer["answers"]) == ["team", "urgent", "tone"]
    assert answer["answers"]["team"]["choice"] in ("billing", "shipping", "legal")
    # question_types.py names each level with str() of the value vLLM parsed.
    assert answer["answers"]["tone"]["legend"] == {"0": "{'calm': None}", "1": "annoyed", "2": "3.5"}
    for qid in ("team", "tone"):
        _probabilities_sum_to_one(answer["answers"][qid])


# -- /v1/decisions, straight ----------------------------------------------------------------


def _sdk(target: Target) -> openai.OpenAI:
    return openai.OpenAI(base_url=target.stack.gateway.url + "/v1", api_key=target.stack.project_key,
                         max_retries=0, timeout=30)


SDK_QUESTIONS: list[dict[str, Any]] = [
    {"type": "choice", "name": "team", "instructions": "Which team should handle it?",
     "choices": [{"value": "billing", "description": "payments and refunds"}, {"value": "shipping"}]},
    {"type": "predicate", "instructions": "Is the customer asking for a refund?"},
    {"type": "choice", "name": "flag", "instructions": "Flag it?",
     "choices": [{"value": True}, {"value": "true", "description": "the word"}, {"value": False}]},
    {"type": "score", "name": "tone", "instructions": "How upset is the customer?",
     "levels": [{"label": "calm"}, {"label": "annoyed", "description": "mildly"}, {"label": "furious"}]},
]


def test_the_sdk_example_typed_values_names_and_unnamed_questions(target: Target) -> None:
    result = _sdk(target).post("/decisions", cast_to=object, body={
        "model": MODEL, "input": "My card was charged twice.", "questions": SDK_QUESTIONS})
    assert isinstance(result, dict)
    assert result["model"] == MODEL
    team, refund, flag, tone = result["answers"]
    assert (team["type"], team["name"]) == ("choice", "team") and team["choice"] in ("billing", "shipping")
    assert (refund["type"], refund["name"]) == ("predicate", None) and 0 <= refund["probability"] <= 1
    assert [p["value"] for p in flag["probabilities"]] == [True, "true", False]  # typed, in order
    assert flag["choice"] in (True, "true", False)
    assert [p["label"] for p in tone["probabilities"]] == ["calm", "annoyed", "furious"]
    for answer in (team, flag, tone):
        _probabilities_sum_to_one(answer)
    usage = result["usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_explicit_nulls_are_what_leaving_them_out_means(target: Target) -> None:
    """``"name": null`` and ``"description": null`` are valid for the SDK; vLLM refuses both."""
    questions = [
        {"type": "predicate", "name": None, "instructions": "Refund?"},
        {"type": "choice", "name": None, "instructions": "Team?",
         "choices": [{"value": "billing", "description": None}, {"value": "shipping"}]},
        {"type": "score", "instructions": "Tone?",
         "levels": [{"label": "calm", "description": None}, {"label": "furious"}]},
    ]
    result = body(target.client().post("/v1/decisions", json={
        "model": MODEL, "input": "My card was charged twice.", "questions": questions}), 200)
    assert [a["name"] for a in result["answers"]] == [None, None, None]


def test_prompt_cache_hints_never_reach_vllm(target: Target) -> None:
    result = body(target.client().post("/v1/decisions", json={
        "model": MODEL, "prompt_cache_key": "tenant-picked-key", "prompt_cache_options": {"mode": "explicit"},
        "input": [{"role": "user", "content": [
            {"type": "input_text", "text": "My card was charged twice.",
             "prompt_cache_breakpoint": {"mode": "explicit"}}]}],
        "questions": [{"type": "predicate", "instructions": "Refund?"}]}), 200)
    assert result["answers"][0]["type"] == "predicate"


def test_user_messages_and_instructions_as_parts(target: Target) -> None:
    result = body(target.client().post("/v1/decisions", json={
        "model": MODEL,
        "input": [{"role": "user", "content": "My card was charged twice."},
                  {"type": "message", "role": "user",
                   "content": [{"type": "input_text", "text": "Order 1234."},
                               {"type": "input_text", "text": "Please help."}]}],
        "questions": [{"type": "choice", "instructions": [{"type": "input_text", "text": "Which team?"},
                                                          {"type": "input_text", "text": "Pick one."}],
                       "choices": [{"value": "billing"}, {"value": "shipping"}]}]}), 200)
    assert result["answers"][0]["choice"] in ("billing", "shipping")


def test_a_bad_decision_request_is_arbiters_400_before_vllm(target: Target) -> None:
    response = target.client().post("/v1/decisions", json={
        "model": MODEL, "input": "x", "questions": [{"type": "choice", "instructions": "?",
                                                     "choices": [{"value": "only"}]}]})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "questions[0].choices"


# -- label reading --------------------------------------------------------------------------


LABEL_REQUEST = decision(
    MODEL, state={"ticket": "My card was charged twice.", "amount": 12.50, "lines": ["a", "ü"]},
    instructions="You triage support tickets.")
LABEL_REQUEST["questions"]["bare"] = {"type": "noul"}
# Structured text too: read as vLLM writes it, with str() (labels.vllm_text).
LABEL_REQUEST["questions"].update({f"structured {qid}": q for qid, q in STRUCTURED["questions"].items()})
LABEL_REQUEST["questions"]["many"] = {"type": "choice", "instructions": {"ask": "which letter?"},
                                      "criteria": {f"option {i}": f"the {i}th" if i % 2 else None for i in range(26)}}


def test_label_reading_answers_as_vllm_itself_answers(real_target: Target) -> None:
    """The same model read by Arbiter's label reader (its chat completions and /tokenize) and by
    vLLM's own NextTokenStrategy (/v1/systemone): the same prompts, the same label tokens, so the
    same probabilities, on a server with or without --return-tokens-as-token-ids."""
    native = body(real_target.native("/v1/systemone", {**LABEL_REQUEST, "questions": {
        qid: q for qid, q in LABEL_REQUEST["questions"].items() if qid != "many"}}), 200)
    real_target.labels_on()
    read = body(real_target.client().post("/v1/systemone", json=LABEL_REQUEST), 200)
    assert list(read["answers"]) == list(LABEL_REQUEST["questions"])
    for qid, expected in native["answers"].items():
        got = read["answers"][qid]
        assert got["type"] == expected["type"]
        assert got["probabilities"] == pytest.approx(expected["probabilities"], rel=1e-9, abs=1e-12), qid
        assert got["confidence"] == pytest.approx(expected["confidence"], rel=1e-9, abs=1e-15), qid
        assert read["diagnostics"][qid]["label_mass"] == pytest.approx(
            native["diagnostics"][qid]["label_mass"], rel=1e-9, abs=1e-15)
        assert read["diagnostics"][qid]["argmax_is_label"] == native["diagnostics"][qid]["argmax_is_label"]
    assert read["usage"]["input_tokens"] > native["usage"]["input_tokens"]  # the 26-option question too
    _probabilities_sum_to_one(read["answers"]["many"])


def test_label_reading_reports_the_true_argmax(real_target: Target) -> None:
    """No mask on the read: the sampled token at temperature 0 is the model's argmax, which the
    stub model rarely puts on a label; a masked read would say true every time."""
    real_target.labels_on()
    read = body(real_target.client().post("/v1/systemone", json=decision(MODEL)), 200)
    flags = [entry["argmax_is_label"] for entry in read["diagnostics"].values()]
    assert all(isinstance(flag, bool) for flag in flags) and False in flags
    assert all(0 < entry["label_mass"] < 1 for entry in read["diagnostics"].values())


def test_openai_decisions_over_label_reading(real_target: Target) -> None:
    real_target.labels_on()
    result = body(real_target.client().post("/v1/decisions", json={
        "model": MODEL, "input": "My card was charged twice.", "questions": SDK_QUESTIONS}), 200)
    assert [a["type"] for a in result["answers"]] == ["choice", "predicate", "choice", "score"]
    assert [p["value"] for p in result["answers"][2]["probabilities"]] == [True, "true", False]


# -- chat -------------------------------------------------------------------------------------


def test_chat_passes_through(target: Target) -> None:
    reply = body(target.client().post("/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 1}), 200)
    assert reply["model"] == MODEL
    assert reply["choices"][0]["message"]["role"] == "assistant"
    assert "reasoning" in reply["choices"][0]["message"] or target.kind == "emulator"


def test_chat_streams_through(target: Target) -> None:
    with target.client().stream("POST", "/v1/chat/completions", json={
            "model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 1,
            "stream": True}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and len(events) >= 2


def test_chat_refusal_is_vllms_own(target: Target) -> None:
    response = target.client().post("/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 1,
        "logprob_token_ids": [1, 2]})  # logprob_token_ids needs logprobs: true
    assert response.status_code == 400, response.text
    assert "logprob_token_ids" in response.text


def test_an_unknown_model_is_arbiters_404(target: Target) -> None:
    assert_error(target.client().post("/v1/systemone", json=decision("not-there")), 404)


# -- a model vLLM has no read strategy for --------------------------------------------------


@pytest.fixture
def no_strategy(request: pytest.FixtureRequest, db: Database, gateway_factory: Callable[..., Gateway]) -> Target:
    """The real front end serving an architecture outside vLLM's READ_STRATEGIES (Llama)."""
    return _real(request, "no-strategy", db, gateway_factory)


def test_vllms_501_for_a_model_without_a_read_strategy_passes_through(no_strategy: Target) -> None:
    direct = no_strategy.native("/v1/systemone", decision(MODEL))
    assert direct.status_code == 501
    for _ in range(2):  # a 501 is about the model, not the replica: nothing is taken out of service
        response = no_strategy.client().post("/v1/systemone", json=decision(MODEL))
        assert response.status_code == 501 and response.content == direct.content
    # /v1/decisions: vLLM's own route answers 501 too; the request is translated onto
    # /v1/systemone, whose 501 comes back with its status and message in OpenAI's error shape
    # (as every translated backend error does on this endpoint: docs/api.md).
    translated = no_strategy.client().post("/v1/decisions", json={
        "model": MODEL, "input": "x", "questions": [{"type": "predicate", "instructions": "?"}]})
    assert translated.status_code == 501
    assert translated.json()["error"]["message"] == direct.json()["error"]["message"]


def test_label_reading_makes_it_a_decision_model(no_strategy: Target) -> None:
    no_strategy.labels_on()
    answer = body(no_strategy.client().post("/v1/systemone", json=decision(MODEL)), 200)
    assert list(answer["answers"]) == ["team", "urgent", "tone"]
    _probabilities_sum_to_one(answer["answers"]["team"])
    result = body(no_strategy.client().post("/v1/decisions", json={
        "model": MODEL, "input": "My card was charged twice.", "questions": SDK_QUESTIONS}), 200)
    assert [a["type"] for a in result["answers"]] == ["choice", "predicate", "choice", "score"]


# -- an `openai` service that is a vLLM -----------------------------------------------------


def test_an_openai_service_in_front_of_vllm_is_known_and_salted_per_project(
        vllm_frontends: dict[str, Frontend], db: Database, gateway_factory: Callable[..., Gateway]) -> None:
    """vLLM's own ``GET /version`` (entrypoints/serve/instrumentator/basic.py) tells Arbiter that an
    `openai` service is a vLLM, so its engine gets the project's cache_salt (the stub engine
    records the salt vLLM's renderer put on the prompt), never the tenant's own."""
    url = vllm_frontends["plain"].url
    stack = Stack.provision(db)
    stack.gateway = gateway_factory()
    admin = stack.client("admin")
    assert admin.post("/admin/services", json={"type": "openai", "url": url, "name": "openai-vllm"}).status_code == 201
    view = next(s for s in body(admin.get("/admin/services"), 200)["data"] if s["name"] == "openai-vllm")
    assert view["version"] == "0.33.0" and view["prefix_cache_salted"] is True, view
    httpx.delete(url + "/stub/calls", timeout=10)
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
            "cache_salt": "my-own-salt"}
    body(stack.client().post("/v1/chat/completions", json=chat), 200)
    (call,) = httpx.get(url + "/stub/calls", timeout=10).json()
    assert call["cache_salt"] not in (None, "", "my-own-salt"), call
