"""The vLLM emulator over real HTTP."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from infra_adapters.emulators.vllm import VllmState

MODEL = "Qwen/Qwen3-0.6B"


def _post(client: httpx.Client, body: Any) -> httpx.Response:
    return client.post("/v1/systemone", json=body)


def _one(q: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "state": "s", "questions": {"q": q}, **extra}


def _error(resp: httpx.Response, status: int, err_type: str) -> str:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"]) == (err_type, status)
    return str(error["message"])


def test_version_and_models(vllm_client: httpx.Client, vllm: VllmState) -> None:
    assert vllm_client.get("/version").json() == {"version": "0.11.0"}
    assert vllm_client.get("/health").status_code == 200
    listing = vllm_client.get("/v1/models").json()
    assert listing["object"] == "list"
    (card,) = listing["data"]
    assert card["id"] == MODEL and card["object"] == "model" and card["owned_by"] == "vllm"
    assert card["root"] == MODEL and card["parent"] is None
    assert card["max_model_len"] == 4096 and isinstance(card["created"], int)
    assert card["permission"][0]["object"] == "model_permission"


def test_decision_answer_shape(vllm_client: httpx.Client, make_request: Any) -> None:
    body = make_request(MODEL)
    body["cache_salt"] = "tenant-42"
    body["chat_template_kwargs"] = {"enable_thinking": False}
    body["unknown_top_level"] = 1
    resp = _post(vllm_client, body)
    assert resp.status_code == 200, resp.text
    data = resp.json()
    assert re.fullmatch(r"decision-[0-9a-f]+", data["id"])
    assert data["object"] == "structured_decision"
    assert isinstance(data["created"], int)
    assert data["model"] == MODEL
    assert list(data["answers"]) == ["team", "urgent", "tone"]
    assert list(data["diagnostics"]) == ["team", "urgent", "tone"]
    urgent = data["answers"]["urgent"]
    assert set(urgent) == {"type", "noul", "probabilities", "confidence"}
    assert urgent["probabilities"]["yes"] == urgent["noul"]
    assert urgent["probabilities"]["yes"] + urgent["probabilities"]["no"] == pytest.approx(1)
    for qid, answer in data["answers"].items():
        diag = data["diagnostics"][qid]
        assert diag["argmax_is_label"] is True and 0.8 <= diag["label_mass"] <= 1.0
        top = max(answer["probabilities"].values())
        assert answer["confidence"] == pytest.approx(top * diag["label_mass"])
    assert data["usage"]["output_tokens"] == 3


def test_answers_depend_on_the_question_not_its_id_or_neighbours(
    vllm_client: httpx.Client, make_request: Any
) -> None:
    body = make_request(MODEL)
    full = _post(vllm_client, body).json()
    alone = dict(body, questions={"x": body["questions"]["team"]})
    single = _post(vllm_client, alone).json()
    assert single["answers"]["x"] == full["answers"]["team"]
    assert single["diagnostics"]["x"] == full["diagnostics"]["team"]


def test_same_probabilities_as_ollama(
    vllm_client: httpx.Client, ollama_client: httpx.Client, make_request: Any
) -> None:
    v = _post(vllm_client, make_request(MODEL)).json()["answers"]
    o = _post(ollama_client, make_request("nimble")).json()["answers"]
    assert v["team"]["probabilities"] == o["team"]["probabilities"]
    assert v["urgent"]["noul"] == o["urgent"]["noul"]


def test_unknown_question_field_is_400(vllm_client: httpx.Client) -> None:
    q = {"type": "choice", "criteria": {"a": None, "b": None}, "weight": 2}
    message = _error(_post(vllm_client, _one(q)), 400, "BadRequestError")
    assert "weight" in message and "Extra inputs are not permitted" in message


def test_model_without_read_strategy_is_501(vllm_client: httpx.Client, vllm: VllmState) -> None:
    vllm.models["BAAI/bge-m3"] = {"read_strategy": False}
    body = _one({"type": "noul"}, model="BAAI/bge-m3")
    _error(_post(vllm_client, body), 501, "NotImplementedError")


def test_unknown_model_is_404(vllm_client: httpx.Client) -> None:
    message = _error(_post(vllm_client, _one({"type": "noul"}, model="x")), 404, "NotFoundError")
    assert message == "The model `x` does not exist."


@pytest.mark.parametrize(
    "body",
    [
        _one({"type": "choice", "criteria": {chr(65 + i): None for i in range(27)}}),
        _one({"type": "choice", "criteria": {}}),
        _one({"type": "score", "criteria": ["one"]}),
        _one({"type": "score", "criteria": [str(i) for i in range(11)]}),
        _one({"type": "vote", "criteria": None}),
        _one({"type": "noul", "criteria": {"maybe": None}}),
        _one({"type": "noul"}, cache_salt=""),
        _one({"type": "noul"}, cache_salt=5),
        _one({"type": "noul"}, images=["data:image/png;base64,aGVsbG8="]),
        {"model": MODEL, "state": "s", "questions": {}},
        {"model": MODEL, "state": "s", "questions": {str(i): {"type": "noul"} for i in range(65)}},
        {"model": MODEL, "questions": {"q": {"type": "noul"}}},
        {"model": MODEL, "state": True, "questions": {"q": {"type": "noul"}}},
        [1],
    ],
)
def test_validation_errors(vllm_client: httpx.Client, body: Any) -> None:
    _error(_post(vllm_client, body), 400, "BadRequestError")


def test_accepted_edge_cases(vllm_client: httpx.Client, vllm: VllmState) -> None:
    vllm.models["Cloudflare/clef-flash"] = {"media": ["images", "videos"]}
    ok = [
        _one({"type": "choice", "criteria": {"only": None}}),
        _one({"type": "choice", "criteria": {chr(65 + i): None for i in range(26)}}),
        _one({"type": "noul", "criteria": {"true": None}}),
        {"state": None, "questions": {"q": {"type": "noul"}}},  # default model
        _one(
            {"type": "noul"}, model="Cloudflare/clef-flash", images=["data:image/png;base64,aA=="]
        ),
    ]
    for body in ok:
        resp = _post(vllm_client, body)
        assert resp.status_code == 200, (body, resp.text)
    assert _post(vllm_client, ok[3]).json()["model"] == MODEL


def test_context_length(vllm_client: httpx.Client, vllm: VllmState) -> None:
    vllm.models[MODEL]["max_model_len"] = 64
    message = _error(
        _post(vllm_client, _one({"type": "noul"}, state="w " * 100)), 400, "BadRequestError"
    )
    assert "maximum context length is 64 tokens" in message


def test_instructions_refused_by_fixed_prompt_models(
    vllm_client: httpx.Client, vllm: VllmState
) -> None:
    vllm.models["vllm-sr/d3"] = {"instructions": False, "max_options": 255}
    q = {"type": "noul", "instructions": "Is it?"}
    _error(_post(vllm_client, _one(q, model="vllm-sr/d3")), 400, "BadRequestError")
    many = {"type": "choice", "criteria": {f"o{i}": None for i in range(200)}}
    assert _post(vllm_client, _one(many, model="vllm-sr/d3")).status_code == 200


def test_api_key_guards_v1_only(vllm_client: httpx.Client, vllm: VllmState) -> None:
    vllm.required_bearer = "sk-test"
    denied = _post(vllm_client, _one({"type": "noul"}))
    assert denied.status_code == 401
    assert denied.json() == {"error": "Unauthorized"}
    assert vllm_client.get("/v1/models").status_code == 401
    assert vllm_client.get("/version").status_code == 200
    auth = {"Authorization": "Bearer sk-test"}
    assert vllm_client.get("/v1/models", headers=auth).status_code == 200


def test_fastapi_style_404_and_405(vllm_client: httpx.Client) -> None:
    missing = vllm_client.get("/v1/nothing")
    assert (missing.status_code, missing.json()) == (404, {"detail": "Not Found"})
    wrong = vllm_client.get("/v1/systemone")
    assert (wrong.status_code, wrong.json()) == (405, {"detail": "Method Not Allowed"})
    assert "POST" in wrong.headers["allow"]


def test_requests_are_recorded(vllm_client: httpx.Client, vllm: VllmState) -> None:
    body = _one({"type": "noul"}, cache_salt="salt")
    _post(vllm_client, body)
    (rec,) = vllm.requests
    assert (rec.method, rec.path, rec.json) == ("POST", "/v1/systemone", body)
    assert rec.json["cache_salt"] == "salt"
