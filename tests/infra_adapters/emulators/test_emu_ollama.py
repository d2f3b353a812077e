"""The Ollama emulator over real HTTP."""

from __future__ import annotations

import base64
import math
import re
from datetime import datetime
from typing import Any

import httpx
import pytest

from infra_adapters.emulators.ollama import OllamaState

JSON_CT = "application/json; charset=utf-8"


def _post(client: httpx.Client, body: Any) -> httpx.Response:
    return client.post("/v1/systemone", json=body)


def test_version_tags_and_show(ollama_client: httpx.Client, ollama: OllamaState) -> None:
    assert ollama_client.get("/api/version").json() == {"version": "0.35.0"}
    ollama.version = "0.36.2"
    assert ollama_client.get("/api/version").json() == {"version": "0.36.2"}

    models = ollama_client.get("/api/tags").json()["models"]
    assert [m["name"] for m in models] == ["nimble:latest", "clef:latest", "llama3.2:latest"]
    first = models[0]
    assert first["model"] == "nimble:latest"
    assert re.fullmatch(r"[0-9a-f]{64}", first["digest"])
    assert isinstance(first["size"], int)
    datetime.fromisoformat(first["modified_at"].replace("000Z", "+00:00"))
    assert first["details"]["format"] == "gguf"
    assert first["details"]["quantization_level"] == "Q4_K_M"
    assert set(first["details"]) >= {"family", "families", "parameter_size", "parent_model"}

    show = ollama_client.post("/api/show", json={"model": "clef"}).json()
    assert show["capabilities"] == ["decision", "vision"]
    assert set(show) >= {"modelfile", "parameters", "template", "details", "model_info"}
    old_key = ollama_client.post("/api/show", json={"name": "nimble:latest"})
    assert old_key.json()["capabilities"] == ["decision"]
    missing = ollama_client.post("/api/show", json={"model": "nope"})
    assert missing.status_code == 404
    assert missing.json() == {"error": "model 'nope' not found"}


def test_decision_answer_shape(ollama_client: httpx.Client, make_request: Any) -> None:
    body = make_request("nimble")
    body["keep_alive"] = "5m"
    body["some_future_field"] = {"ignored": True}
    resp = _post(ollama_client, body)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == JSON_CT
    data = resp.json()
    assert data["model"] == "nimble"
    assert list(data["answers"]) == ["team", "urgent", "tone"]
    team, urgent, tone = (data["answers"][k] for k in ("team", "urgent", "tone"))
    assert set(team) == {"type", "choice", "probabilities", "confidence"}
    assert list(team["probabilities"]) == ["billing", "shipping"]
    assert set(urgent) == {"type", "noul"}
    assert set(tone) == {"type", "score", "legend", "probabilities", "confidence"}
    assert tone["legend"] == {"0": "calm", "1": "annoyed", "2": "furious"}
    probs = list(tone["probabilities"].values())
    entropy = -sum(p * math.log(p) for p in probs if p > 0)
    assert tone["confidence"] == pytest.approx(1 - entropy / math.log(3))
    assert data["usage"]["output_tokens"] == 3
    assert data["usage"]["input_tokens"] > 0

    tagged = _post(ollama_client, {**body, "model": "nimble:latest"}).json()
    assert tagged["model"] == "nimble:latest"
    assert tagged["answers"] == data["answers"]


def test_answers_depend_on_the_question_not_its_id_or_neighbours(
    ollama_client: httpx.Client, make_request: Any
) -> None:
    body = make_request("nimble")
    full = _post(ollama_client, body).json()["answers"]
    alone = dict(body, questions={"renamed": body["questions"]["tone"]})
    assert _post(ollama_client, alone).json()["answers"]["renamed"] == full["tone"]
    reordered = dict(body, questions=dict(reversed(list(body["questions"].items()))))
    answers = _post(ollama_client, reordered).json()["answers"]
    assert list(answers) == ["tone", "urgent", "team"]
    assert answers == full


@pytest.mark.parametrize("version", ["0.34.9", "0.6.5", "0.35.0-rc1", "0.0.0"])
def test_old_ollama_has_no_decision_route(
    ollama_client: httpx.Client, ollama: OllamaState, make_request: Any, version: str
) -> None:
    ollama.version = version
    resp = _post(ollama_client, make_request("nimble"))
    assert resp.status_code == 404
    assert resp.headers["content-type"] == "text/plain"  # gin's serveError: no charset
    assert resp.content == b"404 page not found"
    wrong_method = ollama_client.get("/v1/systemone")  # no such route at all: a 404 still
    assert (wrong_method.status_code, wrong_method.content) == (404, b"404 page not found")


@pytest.mark.parametrize("version", ["0.35.0", "0.35.1", "0.36.0", "1.0.0"])
def test_new_enough_ollama_answers(
    ollama_client: httpx.Client, ollama: OllamaState, make_request: Any, version: str
) -> None:
    ollama.version = version
    assert _post(ollama_client, make_request("nimble")).status_code == 200


def test_unknown_route_is_gos_plain_404(ollama_client: httpx.Client) -> None:
    resp = ollama_client.get("/api/nothing")
    assert (resp.status_code, resp.content) == (404, b"404 page not found")
    assert resp.headers["content-type"] == "text/plain"


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("GET", "/api/show", "POST"),
        ("GET", "/v1/systemone", "POST"),
        ("PUT", "/v1/systemone", "POST"),
        ("POST", "/api/version", "HEAD, GET"),
        ("DELETE", "/api/tags", "HEAD, GET"),
        ("POST", "/", "HEAD, GET"),
        ("GET", "/api/pull", "POST"),
        ("POST", "/api/delete", "DELETE"),
        ("GET", "/api/chat", "POST"),
        ("GET", "/api/embed", "POST"),
        ("GET", "/v1/chat/completions", "POST"),
        ("GET", "/v1/embeddings", "POST"),
        ("OPTIONS", "/api/show", "POST"),
    ],
)
def test_wrong_method_on_a_known_route_is_gins_plain_405(
    ollama_client: httpx.Client, method: str, path: str, allow: str
) -> None:
    # server/routes.go sets `r.HandleMethodNotAllowed = true` on its gin router: a path it knows,
    # asked with another method, is 405 "405 method not allowed" (text/plain) with `Allow`.
    resp = ollama_client.request(method, path)
    assert (resp.status_code, resp.content) == (405, b"405 method not allowed")
    assert resp.headers["content-type"] == "text/plain"
    assert resp.headers["allow"] == allow


def test_head_is_served_where_ollama_serves_it(ollama_client: httpx.Client) -> None:
    for path in ("/", "/api/version", "/api/tags"):  # server/routes.go: r.HEAD(...) beside r.GET(...)
        resp = ollama_client.head(path)
        assert (resp.status_code, resp.content) == (200, b""), path


def _one(q: dict[str, Any], model: str = "nimble", **extra: Any) -> dict[str, Any]:
    return {"model": model, "state": "s", "questions": {"q": q}, **extra}


CHOICE2 = {"type": "choice", "criteria": {"a": None, "b": None}}


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (_one(CHOICE2, model="nope"), 404, "model 'nope' not found"),
        (_one(CHOICE2, model="llama3.2"), 400, '"llama3.2" does not support decisions'),
        (_one({"type": "choice", "criteria": {"only": None}}), 400, "choice needs 2 to 255"),
        (_one({"type": "choice", "criteria": {f"o{i}": None for i in range(256)}}), 400, "255"),
        (_one({"type": "score", "criteria": ["a"]}), 400, "score needs 2 to 10"),
        (_one({"type": "score", "criteria": [str(i) for i in range(11)]}), 400, "2 to 10"),
        (_one({"type": "ranking", "criteria": []}), 400, 'unknown type "ranking"'),
        (_one({"type": "noul", "criteria": {"maybe": "x"}}), 400, "noul criteria keys"),
        (_one(CHOICE2, images=["aGVsbG8="]), 400, '"nimble" does not support images'),
        (_one(CHOICE2, keep_alive="soon"), 400, 'invalid duration "soon"'),
        (_one(CHOICE2, keep_alive="-1"), 400, "invalid duration"),
        (_one(CHOICE2, model="clef", images=["data:image/png;base64,aGVsbG8="]), 400, "base64"),
        ({"model": "nimble", "state": "s", "questions": {}}, 400, "questions"),
        ({"model": "nimble", "state": 3, "questions": {"q": CHOICE2}}, 400, "state"),
        ({"state": "s", "questions": {"q": CHOICE2}}, 400, "model is required"),
        (
            {"model": "nimble", "state": "s", "questions": {str(i): CHOICE2 for i in range(65)}},
            400,
            "too many questions",
        ),
        ([1, 2], 400, "cannot unmarshal array"),
    ],
)
def test_validation_errors(
    ollama_client: httpx.Client, body: Any, status: int, message: str
) -> None:
    resp = _post(ollama_client, body)
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"] == JSON_CT
    data = resp.json()
    assert set(data) == {"error"}
    assert message in data["error"]


def test_accepted_edge_cases(ollama_client: httpx.Client) -> None:
    ok = [
        _one(CHOICE2, model="clef", images=["aGVsbG8="]),
        _one(CHOICE2, keep_alive=300),
        _one(CHOICE2, keep_alive="-1m"),
        _one(CHOICE2, keep_alive="1h30m"),
        _one({"type": "choice", "criteria": {f"o{i}": None for i in range(255)}}),
        _one({"type": "noul", "criteria": None}),
        {"model": "nimble", "state": None, "questions": {"q": CHOICE2}},
        {"model": "nimble", "state": "s", "questions": {str(i): CHOICE2 for i in range(64)}},
    ]
    for body in ok:
        resp = _post(ollama_client, body)
        assert resp.status_code == 200, (body, resp.text)


def test_structured_instructions_and_descriptions_are_taken(ollama_client: httpx.Client) -> None:
    """Any JSON value (SPEC §1), counted as the compact JSON a model would read."""
    structured = {"ask": "Which team?", "weights": [1, 2.5, None, True]}
    for q in ({"type": "choice", "instructions": structured, "criteria": {"a": structured, "b": [1], "c": 0}},
              {"type": "noul", "instructions": 7, "criteria": {"true": False, "false": {"x": "y"}}},
              {"type": "score", "instructions": True, "criteria": [structured, 2, "high"]}):
        resp = _post(ollama_client, _one(q))
        assert resp.status_code == 200, (q, resp.text)
    tone = _post(ollama_client, _one({"type": "score", "criteria": [structured, 2]})).json()["answers"]["q"]
    assert tone["legend"] == {"0": structured, "1": 2}  # the levels as they came
    plain = _post(ollama_client, _one({"type": "noul", "instructions": "ask"})).json()["usage"]["input_tokens"]
    shown = _post(ollama_client, _one({"type": "noul", "instructions": ["ask"]})).json()["usage"]["input_tokens"]
    assert shown == plain + 4  # ["ask"]: the brackets and quotes are read too
    refused = _post(ollama_client, _one({"type": "score", "criteria": ["low", None]}))
    assert refused.status_code == 400 and "score levels must not be null" in refused.json()["error"]


def test_not_json_body(ollama_client: httpx.Client) -> None:
    resp = ollama_client.post("/v1/systemone", content=b"{nope")
    assert resp.status_code == 400
    assert "error" in resp.json()


def test_text_limit(ollama_client: httpx.Client) -> None:
    big_state = "word " * 14000  # ~70 KB of text
    assert _post(ollama_client, _one(CHOICE2, state=big_state)).status_code == 413
    # media do not count towards the text limit
    image = base64.b64encode(b"\x89PNG" * 15000).decode()  # 80 KB of base64
    assert _post(ollama_client, _one(CHOICE2, model="clef", images=[image])).status_code == 200


def test_required_bearer(ollama_client: httpx.Client, ollama: OllamaState) -> None:
    ollama.required_bearer = "cloud-key"
    for resp in (
        ollama_client.get("/api/tags"),
        ollama_client.get("/api/tags", headers={"Authorization": "Bearer wrong"}),
    ):
        assert resp.status_code == 401
        assert resp.json() == {"error": "unauthorized"}
    ok = ollama_client.get("/api/tags", headers={"Authorization": "Bearer cloud-key"})
    assert ok.status_code == 200


def test_requests_are_recorded(
    ollama_client: httpx.Client, ollama: OllamaState, make_request: Any
) -> None:
    body = make_request("nimble")
    body["extra"] = 12345678901234567890
    _post(ollama_client, body)
    ollama_client.get("/api/version", headers={"X-Trace": "abc"})
    assert [(r.method, r.path) for r in ollama.requests] == [
        ("POST", "/v1/systemone"),
        ("GET", "/api/version"),
    ]
    first, second = ollama.requests
    assert first.json == body
    assert b"12345678901234567890" in first.body
    assert first.header("content-type") == "application/json"
    assert second.json is None
    assert second.header("x-trace") == "abc"


def test_delete(ollama_client: httpx.Client, ollama: OllamaState) -> None:
    ollama.models["tev1"] = ["decision"]
    gone = ollama_client.request("DELETE", "/api/delete", json={"model": "tev1:latest"})
    assert gone.status_code == 200
    assert ollama.find_model("tev1") is None
    again = ollama_client.request("DELETE", "/api/delete", json={"model": "tev1"})
    assert again.status_code == 404
