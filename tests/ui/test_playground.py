"""The playground of a decision model's card over HTTP: the admin's own state and questions go
through the decision path of /v1/systemone, pinned to the card's service; bad input is a 400 that
says what is wrong, and a backend's error comes back readable."""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Iterator
from contextlib import closing
from typing import Any

import httpx
import orjson
import pytest

from app.api.admin import playground
from app.db.session import Database
from tests.support import Gateway, Stack, body, synced
from tests.ui.conftest import csrf_of, ui_sign_in
from tests.ui.test_roles import admin_key

CARD = re.compile(r'<form method="post" action="/ui/api/models/(\d+)/playground" data-playground="\d+">')


@pytest.fixture
def ui(stack: Stack) -> Iterator[httpx.Client]:
    with closing(ui_sign_in(stack.gateway.url, stack.admin_key)) as client:
        yield client


def model_id(stack: Stack, public_name: str) -> int:
    with stack.client("admin") as admin:
        [model] = [m for m in body(admin.get("/admin/models"), 200)["data"] if m["public_name"] == public_name]
    return int(model["id"])


def ask(ui: httpx.Client, model: int, state: str = playground.EXAMPLE_STATE,
        questions: str | None = None, **extra: Any) -> httpx.Response:
    token = csrf_of(ui.get("/ui/models").text)
    fields = {"state": state, "questions": playground.example_questions() if questions is None else questions}
    return ui.post(f"/ui/api/models/{model}/playground", json={**fields, **extra}, headers={"X-CSRF-Token": token})


def systemone_requests(stack: Stack) -> list[Any]:
    return [r for r in stack.ollama_state.requests if r.path == "/v1/systemone"]


def test_only_decision_models_have_a_playground_prefilled_with_an_example(ui: httpx.Client, stack: Stack) -> None:
    page = ui.get("/ui/models").text
    assert set(map(int, CARD.findall(page))) == {model_id(stack, "nimble"), model_id(stack, "clef")}
    textareas = dict(re.findall(r'<textarea id="playground-\d+-(state|questions)"[^>]*>([^<]*)</textarea>', page))
    assert html.unescape(textareas["state"]) == playground.EXAMPLE_STATE
    assert orjson.loads(html.unescape(textareas["questions"])) == playground.EXAMPLE_QUESTIONS


def test_the_answer_comes_as_bars_per_question_in_order_with_usage(ui: httpx.Client, stack: Stack) -> None:
    answer = ask(ui, model_id(stack, "nimble"))
    result = body(answer, 200)
    assert result["ok"] is True and result["model"] == "nimble" and result["latency_ms"] >= 0
    assert [q["id"] for q in result["questions"]] == ["team", "urgent", "tone"]
    team, urgent, tone = result["questions"]
    assert team["instructions"] == "Which team should handle this ticket?"
    assert [o["name"] for o in team["options"]] == ["billing", "shipping", "security"]
    assert sum(o["probability"] for o in team["options"]) == pytest.approx(1)
    assert team["value"] == team["chosen"] == max(team["options"], key=lambda o: o["probability"])["name"]
    assert 0 <= team["confidence"] <= 1
    # Ollama's noul is one figure, P(true): both outcomes are drawn.
    assert [o["name"] for o in urgent["options"]] == ["true", "false"]
    assert urgent["options"][0]["probability"] == pytest.approx(urgent["value"])
    assert [o["label"] for o in tone["options"]] == ["0: calm", "1: annoyed", "2: furious"]
    assert result["answer"]["answers"]["team"]["choice"] == team["value"]  # the raw JSON, whole
    assert result["usage"] == result["answer"]["usage"] and result["usage"]["input_tokens"] > 0
    [seen] = systemone_requests(stack)
    assert seen.json["model"] == "nimble:latest" and seen.json["state"] == playground.EXAMPLE_STATE
    assert list(seen.json["questions"]) == ["team", "urgent", "tone"]
    assert seen.header("x-request-id") == answer.headers["x-request-id"]


def test_a_state_that_starts_as_json_is_json(ui: httpx.Client, stack: Stack) -> None:
    nimble = model_id(stack, "nimble")
    for typed, sent in (('{"ticket": "late parcel", "amount": 12.50}', {"ticket": "late parcel", "amount": 12.50}),
                        ('["a", "b"]', ["a", "b"]), ('"quoted"', "quoted"), ("null", None),
                        ("  plain words \n", "plain words")):
        assert body(ask(ui, nimble, state=typed), 200)["ok"] is True, typed
        assert systemone_requests(stack)[-1].json["state"] == sent, typed
    assert b'"amount":12.50' in systemone_requests(stack)[0].body  # the number as typed, as the API keeps it


@pytest.mark.parametrize(("fields", "expected"), [
    ({"state": "{broken"}, "State: it is not valid JSON"),
    ({"questions": ""}, "Questions: give at least one"),
    ({"questions": "{team: 1}"}, "Questions: it is not valid JSON"),
    ({"questions": '{"a": {"type": "choice", "criteria": {"x": 1}}, "a": {"type": "noul"}}'}, "duplicate key 'a'"),
    ({"questions": '[{"type": "noul"}]'}, "questions: must be an object of named questions"),
    ({"questions": '{"q": {"type": "guess"}}'}, "questions.q.type"),
    ({"questions": '{"q": {"type": "score", "criteria": ["only one"]}}'}, "questions.q.criteria"),
    ({"questions": '{"q": {"type": "noul", "criteria": {"maybe": 1}}}'}, "questions.q.criteria"),
    ({"state": 42}, 'send {"state": text, "questions": text}'),
    ({"questions": None}, 'send {"state": text, "questions": text}'),
])
def test_bad_input_is_a_400_that_says_what_is_wrong(ui: httpx.Client, stack: Stack, fields: dict[str, Any],
                                                    expected: str) -> None:
    token = csrf_of(ui.get("/ui/models").text)
    sent = {"state": "a ticket", "questions": playground.example_questions(), **fields}
    answer = ui.post(f"/ui/api/models/{model_id(stack, 'nimble')}/playground", json=sent,
                     headers={"X-CSRF-Token": token})
    assert answer.status_code == 400, answer.text
    assert expected in answer.json()["error"] and answer.json()["detail"]["error_type"] == "invalid_request_error"
    assert systemone_requests(stack) == []  # refused before any backend was asked


def test_a_body_that_is_not_json_a_model_that_is_not_for_decisions_and_one_that_is_gone(
        ui: httpx.Client, stack: Stack) -> None:
    token = csrf_of(ui.get("/ui/models").text)
    nimble = model_id(stack, "nimble")
    for raw in (b"state=a", b'{"state": "a", "state": "b", "questions": "{}"}', b"[]"):
        answer = ui.post(f"/ui/api/models/{nimble}/playground", content=raw, headers={"X-CSRF-Token": token})
        assert answer.status_code == 400 and answer.json()["error"], raw
    chat = ask(ui, model_id(stack, "llama3.2"))
    assert chat.status_code == 400 and "does not answer decisions" in chat.json()["error"]
    gone = ask(ui, 999)
    assert gone.status_code == 404 and gone.json()["detail"]["error_type"] == "not_found_error"


def test_the_text_limit_and_the_body_cap_are_the_apis(db: Database, ollama: Any,
                                                       gateway_factory: Callable[..., Gateway]) -> None:
    server, state = ollama
    stack = Stack.provision(db, ollama_url=server.url)
    stack.gateway = synced(gateway_factory(max_body_bytes=256 * 1024))
    stack.ollama, stack.ollama_state = server, state
    with closing(ui_sign_in(stack.gateway.url, stack.admin_key)) as client:
        nimble = model_id(stack, "nimble")
        over_text = body(ask(client, nimble, state="x" * 70_000), 200)  # over the service's 64 KiB of text
        assert over_text["ok"] is False and over_text["status"] == 413 and over_text["source"] == "arbiter"
        assert "over the 65536-byte limit of model 'nimble'" in over_text["error"]
        over_body = ask(client, nimble, state="x" * 300_000)
        assert over_body.status_code == 413 and over_body.json()["detail"]["error_type"] == "request_too_large"
        assert "over the 262144-byte limit" in over_body.json()["error"]
    assert systemone_requests(stack) == []


def test_a_backends_error_comes_back_as_it_came(ui: httpx.Client, stack: Stack) -> None:
    faults = stack.ollama_state.faults
    faults.status, faults.body = 500, b'{"error":"llama runner process has terminated: exit status 2"}'
    result = body(ask(ui, model_id(stack, "nimble")), 200)
    assert result["ok"] is False and result["status"] == 500 and result["source"] == "backend"
    assert "llama runner process has terminated" in result["error"]


def test_operate_and_the_csrf_header_are_needed(ui: httpx.Client, stack: Stack) -> None:
    nimble = model_id(stack, "nimble")
    fields = {"state": "a", "questions": playground.example_questions()}
    for headers in ({}, {"X-CSRF-Token": "wrong"}):
        refused = ui.post(f"/ui/api/models/{nimble}/playground", json=fields, headers=headers)
        assert refused.status_code == 403 and refused.json()["detail"]["error_type"] == "permission_error"
    with closing(ui_sign_in(stack.gateway.url, admin_key(stack, "viewer"))) as viewer:
        page = viewer.get("/ui/models").text
        assert "data-playground" not in page
        refused = viewer.post(f"/ui/api/models/{nimble}/playground", json=fields,
                              headers={"X-CSRF-Token": csrf_of(page)})
        assert refused.status_code == 403
    assert systemone_requests(stack) == []
