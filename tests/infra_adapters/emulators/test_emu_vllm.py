"""The vLLM emulator over real HTTP: `/v1/systemone` as vLLM 0.33 answers and refuses it.

The expected refusals are vLLM's own bodies (vllm/entrypoints/generate/structured_decisions/,
vllm/entrypoints/openai/decisions/question_types.py, the exception handlers in
vllm/entrypoints/serve/exception_handling/), as real vLLM 0.33 returns them for these bodies.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from infra_adapters.emulators.answers import count_tokens, question_tokens
from infra_adapters.emulators.vllm import VllmState
from tests.infra_adapters.emulators.vllm_errors import invalid as _invalid
from tests.infra_adapters.emulators.vllm_errors import refused as _refused

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
    body["priority"] = 3
    resp = _post(vllm_client, body)
    assert resp.status_code == 200, resp.text
    data = resp.json()
    # structured_decisions/protocol.py StructuredDecisionResponse, `joint` null unless read jointly
    assert set(data) == {"id", "object", "created", "model", "answers", "usage", "diagnostics", "joint"}
    assert re.fullmatch(r"decision-[0-9a-f]+", data["id"])
    assert data["object"] == "structured_decision" and data["joint"] is None
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
    assert set(data["usage"]) == {"input_tokens", "output_tokens"} and data["usage"]["output_tokens"] == 3
    named = _post(vllm_client, dict(body, request_id="abc")).json()
    assert named["id"] == "decision-abc"  # the request's request_id names the decision


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


def test_unknown_top_level_fields_are_refused_by_pydantic(vllm_client: httpx.Client) -> None:
    # StructuredDecisionRequest is extra="forbid"; keep_alive is not one of its fields.
    _invalid(_post(vllm_client, _one({"type": "noul"}, keep_alive=5)), "body.keep_alive",
             "{'type': 'extra_forbidden', 'loc': 'body.keep_alive', 'msg': 'Extra inputs are not permitted', "
             "'input': '5'}")
    _invalid(_post(vllm_client, _one({"type": "noul"}, unknown_top_level=1, other="x")), "body.unknown_top_level",
             "{'type': 'extra_forbidden', 'loc': 'body.unknown_top_level', 'msg': 'Extra inputs are not permitted', "
             "'input': '1'}",
             "{'type': 'extra_forbidden', 'loc': 'body.other', 'msg': 'Extra inputs are not permitted', "
             "'input': 'x'}")


def test_unknown_question_fields_are_refused_by_the_server(vllm_client: httpx.Client) -> None:
    # QuestionSpec allows extra fields; serving.py parse_questions refuses them.
    q = {"type": "choice", "criteria": {"a": None, "b": None}, "weight": 2, "z": 1}
    _refused(_post(vllm_client, _one(q)), "question 'q': unknown field(s) ['weight', 'z']")


@pytest.mark.parametrize(("extra", "param", "error"), [
    ({"instructions": ["a"]}, "body.instructions",
     ("{'type': 'string_type', 'loc': 'body.instructions', 'msg': 'Input should be a valid string', "
     "'input': '<list of 1 items>'}")),
    ({"instructions": 5}, "body.instructions",
     "{'type': 'string_type', 'loc': 'body.instructions', 'msg': 'Input should be a valid string', 'input': '5'}"),
    ({"joint": "true"}, "body.joint",
     "{'type': 'bool_type', 'loc': 'body.joint', 'msg': 'Input should be a valid boolean', 'input': 'true'}"),
    ({"joint": 1}, "body.joint",
     "{'type': 'bool_type', 'loc': 'body.joint', 'msg': 'Input should be a valid boolean', 'input': '1'}"),
    ({"chat_template_kwargs": [1]}, "body.chat_template_kwargs",
     ("{'type': 'dict_type', 'loc': 'body.chat_template_kwargs', 'msg': 'Input should be a valid dictionary', "
     "'input': '<list of 1 items>'}")),
    ({"images": "x"}, "body.images",
     "{'type': 'list_type', 'loc': 'body.images', 'msg': 'Input should be a valid list', 'input': 'x'}"),
    ({"images": [1]}, "body.images.0",
     "{'type': 'string_type', 'loc': 'body.images.0', 'msg': 'Input should be a valid string', 'input': '1'}"),
    ({"priority": 1.5}, "body.priority",
     ("{'type': 'int_from_float', 'loc': 'body.priority', 'msg': 'Input should be a valid integer, got a number "
     "with a fractional part', 'input': '1.5'}")),
    ({"model": 5}, "body.model",
     "{'type': 'string_type', 'loc': 'body.model', 'msg': 'Input should be a valid string', 'input': '5'}"),
    ({"questions": [1]}, "body.questions",
     ("{'type': 'dict_type', 'loc': 'body.questions', 'msg': 'Input should be a valid dictionary', "
     "'input': '<list of 1 items>'}")),
    ({"questions": {"q": {"type": 5}}}, "body.questions.q.type",
     ("{'type': 'string_type', 'loc': 'body.questions.q.type', 'msg': 'Input should be a valid string', "
     "'input': '5'}")),
    ({"questions": {"q": "notadict"}}, "body.questions.q",
     ("{'type': 'model_attributes_type', 'loc': 'body.questions.q', 'msg': 'Input should be a valid dictionary "
     "or object to extract fields from', 'input': 'notadict'}")),
])
def test_schema_refusals(vllm_client: httpx.Client, extra: dict[str, Any], param: str, error: str) -> None:
    _invalid(_post(vllm_client, _one({"type": "noul"}, **extra)), param, error)


def test_bodies_pydantic_cannot_read(vllm_client: httpx.Client) -> None:
    missing = "{'type': 'missing', 'loc': 'body', 'msg': 'Field required', 'input': 'None'}"
    _invalid(vllm_client.post("/v1/systemone", content=b"", headers={"content-type": "application/json"}),
             "body", missing)
    _invalid(vllm_client.post("/v1/systemone", content=b"null", headers={"content-type": "application/json"}),
             "body", missing)
    broken = vllm_client.post("/v1/systemone", content=b"{bad json", headers={"content-type": "application/json"})
    _invalid(broken, "body.1", "{'type': 'json_invalid', 'loc': 'body.1', 'msg': 'JSON decode error', "
             "'input': '<dict of 0 items>', 'ctx': {'error': 'Expecting property name enclosed in double quotes'}}")
    _invalid(_post(vllm_client, [1]), "body", "{'type': 'model_attributes_type', 'loc': 'body', 'msg': 'Input "
             "should be a valid dictionary or object to extract fields from', 'input': '<list of 1 items>'}")
    _invalid(_post(vllm_client, {}), "body.state",
             "{'type': 'missing', 'loc': 'body.state', 'msg': 'Field required', 'input': '<dict of 0 items>'}",
             "{'type': 'missing', 'loc': 'body.questions', 'msg': 'Field required', 'input': '<dict of 0 items>'}")
    many = _post(vllm_client, _one({"type": "noul"}, **{f"x{i}": i for i in range(12)})).json()["error"]
    assert many["message"].startswith("12 validation errors:\n") and many["message"].endswith("...and 2 more errors")


def test_joint_needs_a_diffusion_model(vllm_client: httpx.Client) -> None:
    _refused(_post(vllm_client, _one({"type": "noul"}, joint=True)),
             "joint: this model reads each question on its own; joint reads need DiffusionGemma")
    assert _post(vllm_client, _one({"type": "noul"}, joint=False)).status_code == 200


def test_thinking_must_be_off(vllm_client: httpx.Client) -> None:
    on = _one({"type": "noul"}, chat_template_kwargs={"enable_thinking": True})
    _refused(_post(vllm_client, on), "a read is the reply's first token, so thinking must be off")


def test_media_the_model_does_not_take(vllm_client: httpx.Client, vllm: VllmState) -> None:
    vllm.models[MODEL]["media"] = ["images"]  # a vision model read next-token: images only
    _refused(_post(vllm_client, _one({"type": "noul"}, audio=["data:audio/wav;base64,AA=="])),
             "this model does not take audio inputs")
    _refused(_post(vllm_client, _one({"type": "noul"}, videos=["data:video/mp4;base64,AA=="], audio=["x"])),
             "this model does not take audio, video inputs")
    ok = _one({"type": "noul"}, images=["data:image/png;base64,aA=="], audio=[])
    assert _post(vllm_client, ok).status_code == 200
    _refused(_post(vllm_client, _one({"type": "noul"}, images=["ftp://x/y.png"])),
             "media: The URL must be either a HTTP, data or file URL.")
    vllm.models[MODEL]["media"] = []
    _refused(_post(vllm_client, ok), "this model does not take image inputs")


@pytest.mark.parametrize(("question", "message"), [
    ({"type": "choice", "criteria": {chr(65 + i): None for i in range(27)}},
     "question 'q': at most 26 options for this model"),
    ({"type": "choice", "criteria": {}},
     "question 'q': choice criteria must map option names to a description or null"),
    ({"type": "choice", "criteria": [1]},
     "question 'q': choice criteria must map option names to a description or null"),
    ({"type": "score", "criteria": ["one"]}, "question 'q': score criteria must be an ordered list of levels"),
    ({"type": "score", "criteria": [str(i) for i in range(11)]}, "question 'q': at most 10 options for this model"),
    ({"type": "score", "criteria": ["a", "a"]}, "question 'q': duplicate option names"),
    ({"type": "vote", "criteria": None}, "unknown question type 'vote'; supported: ['choice', 'noul', 'score']"),
    ({"type": "noul", "criteria": {"maybe": None}},
     "question 'q': noul criteria must be an object with true and false"),
    ({"type": "noul", "criteria": "x"}, "question 'q': noul criteria must be an object with true and false"),
])
def test_question_type_refusals(vllm_client: httpx.Client, question: dict[str, Any], message: str) -> None:
    _refused(_post(vllm_client, _one(question)), message)  # question_types.py build_question


def test_question_counts_and_ids(vllm_client: httpx.Client) -> None:
    _refused(_post(vllm_client, {"model": MODEL, "state": "s", "questions": {}}),
             "questions: needs at least one question")
    many = {str(i): {"type": "noul"} for i in range(65)}
    _refused(_post(vllm_client, {"model": MODEL, "state": "s", "questions": many}),
             "questions: at most 64 for this model")
    _refused(_post(vllm_client, {"model": MODEL, "state": "s", "questions": {"": {"type": "noul"}}}),
             "question ids must be non-empty")


def test_cache_salt_is_checked_before_the_fields(vllm_client: httpx.Client) -> None:
    for salt in ("", 5):
        _refused(_post(vllm_client, _one({"type": "noul"}, cache_salt=salt, extra=1)),
                 "Parameter 'cache_salt' must be a non-empty string if provided. (parameter=cache_salt)", "cache_salt")
    _refused(_post(vllm_client, _one({"type": "noul"}, cache_salt="a/b")),
             "Parameter 'cache_salt' must be at most 128 characters and must not contain '@', '/', '\\\\', or NUL. "
             "(parameter=cache_salt)", "cache_salt")


def test_model_without_read_strategy_is_501(vllm_client: httpx.Client, vllm: VllmState) -> None:
    vllm.models["BAAI/bge-m3"] = {"read_strategy": False}
    body = _one({"type": "noul"}, model="BAAI/bge-m3")
    _refused(_post(vllm_client, body), "The model does not support the structured decision API", status=501,
             err_type="NotImplementedError")
    vllm.logprobs_mode = "raw_logits"  # strategies.py select_read_strategy needs a logprobs mode
    _error(_post(vllm_client, _one({"type": "noul"})), 501, "NotImplementedError")


def test_unknown_model_is_404(vllm_client: httpx.Client, vllm: VllmState) -> None:
    vllm.models["other"] = {}
    _refused(_post(vllm_client, _one({"type": "noul"}, model="x")),
             f"The model `x` does not exist. Valid aliases: {MODEL}, other.", "model", 404, "NotFoundError")


def test_accepted_edge_cases(vllm_client: httpx.Client, vllm: VllmState) -> None:
    vllm.models["Cloudflare/clef-flash"] = {"media": ["images", "videos"]}
    ok = [
        _one({"type": "choice", "criteria": {"only": None}}),
        _one({"type": "choice", "criteria": {chr(65 + i): None for i in range(26)}}),
        _one({"type": "choice", "criteria": {"a": {"x": 1}, "b": [1]}}),  # descriptions are str()ed
        _one({"type": "noul", "criteria": {"true": None}}),
        _one({"type": "noul", "criteria": {}}),
        _one({"type": "score", "instructions": 7, "criteria": [1, "two"]}),  # instructions: Any
        {"state": None, "questions": {"q": {"type": "noul"}}},  # default model
        {"state": True, "questions": {"q": {"type": "noul"}}},  # state: Any
        _one({"type": "noul"}, instructions=None, images=None),
        _one({"type": "noul"}, model="Cloudflare/clef-flash", images=["data:image/png;base64,aA=="]),
    ]
    for body in ok:
        resp = _post(vllm_client, body)
        assert resp.status_code == 200, (body, resp.text)
    assert _post(vllm_client, ok[6]).json()["model"] == MODEL


def test_structured_text_is_shown_as_vllm_shows_it(vllm_client: httpx.Client) -> None:
    """question_types.py: a non-string instructions, description or level is ``str()`` of what
    vLLM parsed: the score's legend names each level so, and the reads count that text."""
    levels = [{"calm": True}, ["a", None], 2.5, "furious"]
    tone = _post(vllm_client, _one({"type": "score", "criteria": levels})).json()["answers"]["q"]
    assert tone["legend"] == {"0": "{'calm': True}", "1": "['a', None]", "2": "2.5", "3": "furious"}

    def tokens(instructions: str) -> int:  # the instructions as JSON text, sent as written
        raw = '{"model": "%s", "state": "s", "questions": {"q": {"type": "noul", "instructions": %s}}}'
        answer = vllm_client.post("/v1/systemone", content=(raw % (MODEL, instructions)).encode())
        assert answer.status_code == 200, answer.text
        return int(answer.json()["usage"]["input_tokens"])

    # 1e3 is read as the float 1000.0: three tokens ("1000", ".", "0"), not one.
    assert tokens('{"n": 1e3}') == tokens('"{\'n\': 1000.0}"') == tokens('"{\'n\': 1e3}"') + 2
    assert tokens("null") == tokens('""')


def test_context_length(vllm_client: httpx.Client, vllm: VllmState) -> None:
    q = {"type": "noul"}
    state = "w " * 100
    tokens = question_tokens(count_tokens(state), q)
    vllm.models[MODEL]["max_model_len"] = 64
    # vllm/v1/engine/input_processor.py: the engine refuses the read's prompt
    _refused(_post(vllm_client, _one(q, state=state)),
             f"The decoder prompt (length {tokens}) is longer than the maximum model length of 64. Make sure "
             "that `max_model_len` is no smaller than the number of text tokens.")
    vllm.models[MODEL]["max_model_len"] = tokens
    message = _error(_post(vllm_client, _one(q, state=state)), 400, "BadRequestError")
    assert message.startswith(f"The decoder prompt (length {tokens}) plus the number of requested output tokens")
    vllm.models[MODEL]["max_model_len"] = tokens + 1
    assert _post(vllm_client, _one(q, state=state)).status_code == 200


def test_fixed_prompt_models(vllm_client: httpx.Client, vllm: VllmState) -> None:
    vllm.models["vllm-sr/d3"] = {"instructions": False, "max_options": 255}
    q = {"type": "noul", "instructions": "Is it?"}  # a question's instructions are part of D3's prompt
    assert _post(vllm_client, _one(q, model="vllm-sr/d3")).status_code == 200
    _refused(_post(vllm_client, _one(q, model="vllm-sr/d3", instructions="Context")),
             "this model reads a fixed prompt, so it takes no instructions")
    many = {"type": "choice", "criteria": {f"o{i}": None for i in range(200)}}  # D3 reads no labels
    assert _post(vllm_client, _one(many, model="vllm-sr/d3")).status_code == 200
    too_many = {"type": "choice", "criteria": {f"o{i}": None for i in range(256)}}
    _refused(_post(vllm_client, _one(too_many, model="vllm-sr/d3")), "question 'q': at most 255 options for this model")


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
