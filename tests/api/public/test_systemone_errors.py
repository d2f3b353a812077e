"""POST /v1/systemone: every row of SPEC §1's error table, and the order of the checks."""

from __future__ import annotations

import datetime as dt
import gzip
import json
import socket
from typing import Any

import orjson
import pytest
import zstandard
from sqlalchemy import update

from app.db.models import ApiKey, Project
from tests.support import Stack, add_service, assert_error, decision, tampered


def post(stack: Stack, body: Any, key: str | None = "project", **kwargs: Any) -> Any:
    content = body if isinstance(body, (bytes, str)) else orjson.dumps(body)
    with stack.client(key) as client:
        return client.post("/v1/systemone", content=content, **kwargs)


def questions(**kinds: Any) -> dict[str, Any]:
    return {"questions": kinds}


# -- 400: the body and its fields ------------------------------------------------------

BAD_BODIES = {
    "not json": b"{not json",
    "not an object": b"[1, 2, 3]",
    "duplicate keys": b'{"model":"nimble","model":"clef","state":"s","questions":{"q":{"type":"noul"}}}',
    "NaN": b'{"model":"nimble","state":NaN,"questions":{"q":{"type":"noul"}}}',
    "Infinity": b'{"model":"nimble","state":{"x":Infinity},"questions":{"q":{"type":"noul"}}}',
    "not utf-8": b'{"model":"nimble","state":"\xff","questions":{"q":{"type":"noul"}}}',
    "a lone surrogate in the model": b'{"model":"nimble\\udfff","state":"s","questions":{"q":{"type":"noul"}}}',
    "empty": b"",
    # Parse, but cannot be written back for the backend (were 500s once a replica was picked).
    "a lone surrogate": b'{"model":"nimble","state":"\\ud800","questions":{"q":{"type":"noul"}}}',
    "a lone surrogate in a key": b'{"model":"nimble","state":"s","questions":{"q\\udc00":{"type":"noul"}}}',
    "nesting past 255 levels": b'{"model":"nimble","state":' + b"[" * 300 + b"]" * 300
                               + b',"questions":{"q":{"type":"noul"}}}',
}


@pytest.mark.parametrize("name", BAD_BODIES)
def test_unparseable_bodies_are_400(stack: Stack, name: str) -> None:
    body = assert_error(post(stack, BAD_BODIES[name]), 400)
    assert isinstance(body["detail"], list)
    assert not [r for r in stack.ollama_state.requests if r.path == "/v1/systemone"]


def _without(field: str) -> dict[str, Any]:
    body = decision()
    del body[field]
    return body


FIELD_CASES: dict[str, tuple[dict[str, Any], list[Any]]] = {
    "model missing": (_without("model"), ["body", "model"]),
    "model empty": (decision(model=""), ["body", "model"]),
    "model not a string": (decision(model=7), ["body", "model"]),
    "state missing": (_without("state"), ["body", "state"]),
    "state a number": (decision(state=3), ["body", "state"]),
    "state a float": (decision(state=3.5), ["body", "state"]),
    "state a boolean": (decision(state=True), ["body", "state"]),
    "questions missing": (_without("questions"), ["body", "questions"]),
    "questions a list": (decision(questions=[{"type": "noul"}]), ["body", "questions"]),
    "no questions": (decision(questions={}), ["body", "questions"]),
    "65 questions": (decision(questions={f"q{i}": {"type": "noul"} for i in range(65)}), ["body", "questions"]),
    "empty question id": (decision(questions={"": {"type": "noul"}}), ["body", "questions", ""]),
    "question not an object": (decision(questions={"q": "noul"}), ["body", "questions", "q"]),
    "type missing": (decision(questions={"q": {"criteria": None}}), ["body", "questions", "q", "type"]),
    "unknown type": (decision(questions={"q": {"type": "rank"}}), ["body", "questions", "q", "type"]),
    "choice without criteria": (decision(questions={"q": {"type": "choice"}}),
                                ["body", "questions", "q", "criteria"]),
    "choice with a list": (decision(questions={"q": {"type": "choice", "criteria": ["a", "b"]}}),
                           ["body", "questions", "q", "criteria"]),
    "choice with no options": (decision(questions={"q": {"type": "choice", "criteria": {}}}),
                               ["body", "questions", "q", "criteria"]),
    "choice with 256 options": (decision(questions={"q": {"type": "choice",
                                                          "criteria": {f"o{i}": None for i in range(256)}}}),
                                ["body", "questions", "q", "criteria"]),
    "score without criteria": (decision(questions={"q": {"type": "score"}}),
                               ["body", "questions", "q", "criteria"]),
    "score with one level": (decision(questions={"q": {"type": "score", "criteria": ["only"]}}),
                             ["body", "questions", "q", "criteria"]),
    "score with 11 levels": (decision(questions={"q": {"type": "score", "criteria": [str(i) for i in range(11)]}}),
                             ["body", "questions", "q", "criteria"]),
    "score level null": (decision(questions={"q": {"type": "score", "criteria": ["a", None]}}),
                         ["body", "questions", "q", "criteria", 1]),
    "noul with a bad key": (decision(questions={"q": {"type": "noul", "criteria": {"maybe": "x"}}}),
                            ["body", "questions", "q", "criteria", "maybe"]),
    "noul with a list": (decision(questions={"q": {"type": "noul", "criteria": ["true"]}}),
                         ["body", "questions", "q", "criteria"]),
    "keep_alive soon": (decision(keep_alive="soon"), ["body", "keep_alive"]),
    "keep_alive -1 string": (decision(keep_alive="-1"), ["body", "keep_alive"]),
    "keep_alive boolean": (decision(keep_alive=True), ["body", "keep_alive"]),
    "images not a list": (decision(images="abc"), ["body", "images"]),
    "images ftp url": (decision(images=["ftp://example.com/a.png"]), ["body", "images", 0]),
}


@pytest.mark.parametrize("name", FIELD_CASES)
def test_field_rules_are_400_with_their_location(stack: Stack, name: str) -> None:
    body, loc = FIELD_CASES[name]
    error = assert_error(post(stack, body), 400)
    assert loc in [item["loc"] for item in error["detail"]], error
    assert error["error"].startswith(".".join(str(p) for p in error["detail"][0]["loc"][1:]))
    assert not stack.ollama_state.requests or all(r.path != "/v1/systemone" for r in stack.ollama_state.requests)


@pytest.mark.parametrize("value", ["5m", "1h30m", "-1m", "0", 300, -1, 2.5])
def test_valid_keep_alive_values_pass(stack: Stack, value: Any) -> None:
    assert post(stack, decision(keep_alive=value)).status_code == 200


def test_instructions_and_state_may_be_null_objects_or_arrays(stack: Stack) -> None:
    body = decision(state=None)
    body["questions"]["team"]["instructions"] = {"lang": "en", "steps": ["read", "route"]}
    assert post(stack, body).status_code == 200
    assert post(stack, decision(state=[1, "two"])).status_code == 200


@pytest.mark.parametrize("value", [4, 2.5, True, False, None, {"a": [1]}, ["x", 2]])
def test_instructions_and_descriptions_may_be_any_json_value(stack: Stack, value: Any) -> None:
    """SPEC §1: the gateway checks only the shapes it names; the backend shows the value."""
    body = decision(questions={"team": {"type": "choice", "instructions": value, "criteria": {"a": value, "b": 1}},
                               "urgent": {"type": "noul", "instructions": value, "criteria": {"true": value}},
                               "tone": {"type": "score", "instructions": value, "criteria": [value or 0, 1]}})
    response = post(stack, body)
    assert response.status_code == 200, response.text
    assert list(response.json()["answers"]) == ["team", "urgent", "tone"]


def test_media_for_a_model_without_the_capability_is_400(stack: Stack) -> None:
    error = assert_error(post(stack, decision(images=["iVBORw0KGgo="])), 400)
    assert "vision" in error["error"]
    assert post(stack, decision("clef", images=["iVBORw0KGgo="])).status_code == 200
    assert post(stack, decision("clef", images=["data:image/png;base64,iVBORw0KGgo="])).status_code == 200
    sent = [r for r in stack.ollama_state.requests if r.path == "/v1/systemone"][-1]
    assert sent.json["images"] == ["iVBORw0KGgo="]  # Ollama takes plain base64
    assert_error(post(stack, decision("clef", audio=["UklGRg=="])), 400)


def test_remote_media_urls_are_refused_unless_allowed(stack: Stack, gateway_factory: Any) -> None:
    body = decision("clef", images=["https://example.com/cat.png"])
    error = assert_error(post(stack, body), 400)
    assert "remote media" in error["error"]
    permissive = gateway_factory(allow_remote_media_urls=True)
    with permissive.client(stack.project_key) as client:
        client.post("/v1/systemone", json=body)  # the backend decides what to do with it
    sent = [r for r in stack.ollama_state.requests if r.path == "/v1/systemone"]
    assert len(sent) == 1 and sent[0].json["images"] == ["https://example.com/cat.png"]


@pytest.mark.parametrize("url", [" " * 40 + "http://169.254.169.254/", "\t" * 40 + "file:///etc/passwd",
                                 "\x00" * 40 + "ftp://169.254.169.254/"])
def test_a_url_behind_leading_blanks_is_still_a_url(stack: Stack, url: str) -> None:
    assert_error(post(stack, decision("clef", images=[url])), 400)
    assert not [r for r in stack.ollama_state.requests if r.path == "/v1/systemone"]


def test_a_model_without_the_decision_capability_is_400(stack: Stack) -> None:
    error = assert_error(post(stack, decision("llama3.2")), 400)
    assert "not a decision model" in error["error"]


# -- 401 ---------------------------------------------------------------------------------

def test_missing_unknown_and_malformed_keys_are_401(stack: Stack) -> None:
    forged = tampered(stack.project_key)
    for key in (None, "arb_proj_unknown", forged, "not-an-arbiter-key", "x" * 500):
        response = post(stack, decision(), key=key)
        assert_error(response, 401)
        assert response.headers["www-authenticate"] == "Bearer"
        assert response.headers["connection"] == "close"
        if key:
            assert key not in response.text
    with stack.gateway.client() as client:
        basic = client.post("/v1/systemone", json=decision(), headers={"Authorization": "Basic dXNlcjpwdw=="})
    assert_error(basic, 401)


def test_revoked_and_expired_keys_are_401(stack: Stack) -> None:
    assert post(stack, decision()).status_code == 200
    past = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
    with stack.db.session() as session:
        session.execute(update(ApiKey).where(ApiKey.kind == "project").values(revoked_at=past))
    stack.gateway.app.components.keys.invalidate()
    assert "revoked or expired" in assert_error(post(stack, decision()), 401)["error"]
    with stack.db.session() as session:
        session.execute(update(ApiKey).where(ApiKey.kind == "project").values(revoked_at=None, expires_at=past))
    stack.gateway.app.components.keys.invalidate()
    assert_error(post(stack, decision()), 401)


def test_an_admin_key_cannot_call_models(stack: Stack) -> None:
    error = assert_error(post(stack, decision(), key="admin"), 401)
    assert "project key" in error["error"]


def head_only(port: int, headers: str) -> bytes:
    """Send a request's head declaring a big body, never the body; return the answer's head."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(f"POST /v1/systemone HTTP/1.1\r\nHost: x\r\n{headers}Content-Type: application/json\r\n"
                 "Content-Length: 40000000\r\n\r\n".encode())
    sock.settimeout(5)
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += sock.recv(65536)
    sock.close()
    return answer


def test_401_comes_before_reading_the_body(stack: Stack) -> None:
    answer = head_only(stack.gateway.port, "Authorization: Bearer arb_proj_wrong\r\n")
    assert answer.startswith(b"HTTP/1.1 401")
    assert b"connection: close" in answer.lower()


# -- 403 / 404 ---------------------------------------------------------------------------

def test_a_model_outside_the_allowlist_is_403_whether_or_not_it_exists(stack: Stack) -> None:
    key = stack.new_project("narrow", models=["clef"])
    for model in ("nimble", "no-such-model"):
        error = assert_error(post(stack, decision(model), key=key), 403)
        assert model in error["error"]
    assert post(stack, decision("clef"), key=key).status_code == 200


def test_an_archived_project_is_403(stack: Stack) -> None:
    with stack.db.session() as session:
        session.execute(update(Project).values(archived=True))
    stack.gateway.app.components.keys.invalidate()
    assert "archived" in assert_error(post(stack, decision()), 403)["error"]


def test_a_model_that_is_not_installed_is_404(stack: Stack) -> None:
    assert "not installed" in assert_error(post(stack, decision("ghost")), 404)["error"]


def test_model_listing_is_scoped_to_the_project(stack: Stack) -> None:
    key = stack.new_project("narrow", models=["clef", "ghost"])
    with stack.gateway.client(key) as client:
        listed = client.get("/v1/models").json()
    assert listed["object"] == "list"
    assert [m["id"] for m in listed["data"]] == ["clef"]
    assert listed["data"][0]["capabilities"] == ["decision", "vision"]
    with stack.client() as client:
        assert {m["id"] for m in client.get("/v1/models").json()["data"]} == {"clef", "nimble", "llama3.2"}
        assert_error(client.get("/v1/models", headers={"Authorization": "Bearer arb_proj_x"}), 401)


# -- 405 ---------------------------------------------------------------------------------

def test_an_ollama_that_stopped_serving_decisions_is_405(stack: Stack) -> None:
    stack.ollama_state.version = "0.34.9"  # downgraded after install: plain-text 404 for the route
    error = assert_error(post(stack, decision()), 405, "unsupported_error")
    assert "does not serve /v1/systemone" in error["error"]


def test_wrong_method_is_405_with_allow(stack: Stack) -> None:
    with stack.client() as client:
        response = client.get("/v1/systemone")
    assert_error(response, 405, "method_not_allowed")
    assert response.headers["allow"] == "POST"


# -- 413 / 415 ---------------------------------------------------------------------------

def test_a_declared_length_over_the_cap_is_refused_before_reading(stack: Stack, gateway_factory: Any) -> None:
    small = gateway_factory(max_body_bytes=1000)
    answer = head_only(small.port, f"Authorization: Bearer {stack.project_key}\r\n")
    assert answer.startswith(b"HTTP/1.1 413")
    assert b"connection: close" in answer.lower()


def test_a_streamed_body_over_the_cap_is_413(stack: Stack, gateway_factory: Any) -> None:
    small = gateway_factory(max_body_bytes=10_000)
    chunks = (b"x" * 4096 for _ in range(10))  # chunked: no Content-Length to refuse early
    with small.client(stack.project_key) as client:
        response = client.post("/v1/systemone", content=chunks)
    assert_error(response, 413)


@pytest.mark.parametrize("encoding", ["gzip", "zstd"])
def test_a_decompression_bomb_is_413(stack: Stack, encoding: str) -> None:
    payload = b'{"model":"nimble","state":"' + b"a" * (40 * 1024 * 1024) + b'"}'
    data = gzip.compress(payload) if encoding == "gzip" else zstandard.ZstdCompressor().compress(payload)
    assert len(data) < 1024 * 1024
    response = post(stack, data, headers={"Content-Encoding": encoding})
    assert_error(response, 413)


def test_text_over_64_kib_is_413_but_media_do_not_count(stack: Stack) -> None:
    body = decision(state="w " * 33_000)  # ~66 KB of text
    assert "65536-byte limit" in assert_error(post(stack, body), 413)["error"]
    image = "A" * (200 * 1024)  # 200 KB of base64, not text
    assert post(stack, decision("clef", images=[image])).status_code == 200


def _structured_text(size: int) -> bytes:
    """A body whose text (compact JSON, media left out) is ``size`` bytes, nearly all of it in
    structured instructions and descriptions; sent indented, so its bytes are many more."""
    def body(pad: str) -> dict[str, Any]:
        return decision(questions={"q": {
            "type": "choice", "instructions": [{"n": i, "seen": [True, None]} for i in range(1500)],
            "criteria": {"a": {"why": pad, "ids": list(range(2000))}, "b": None}}})
    base = len(orjson.dumps(body("")))
    text = body("x" * (size - base))
    assert len(orjson.dumps(text)) == size
    return json.dumps(text, indent=4).encode()


def test_structured_instructions_and_descriptions_count_as_text_like_the_state(stack: Stack) -> None:
    stack.ollama_state.text_limit = 1 << 20  # Arbiter's count is the one under test, not Ollama's
    at_limit, over = _structured_text(65536), _structured_text(65537)
    assert len(at_limit) > 2 * 65536  # the spaces are not text
    response = post(stack, at_limit)
    assert response.status_code == 200, response.text[:300]
    assert "65537 bytes, over the 65536-byte limit" in assert_error(post(stack, over), 413)["error"]


def test_unsupported_encoding_is_415(stack: Stack) -> None:
    response = post(stack, b"...", headers={"Content-Encoding": "br"})
    assert_error(response, 415, "unsupported_error")
    assert "gzip" in response.headers["accept-encoding"]


def test_corrupt_gzip_is_400(stack: Stack) -> None:
    assert_error(post(stack, b"\x1f\x8bnot really gzip", headers={"Content-Encoding": "gzip"}), 400)


# -- order of checks ---------------------------------------------------------------------

def test_checks_run_in_spec_order(stack: Stack) -> None:
    narrow = stack.new_project("narrow", models=["clef"])
    # 401 before 415
    assert post(stack, b"{}", key=None, headers={"Content-Encoding": "br"}).status_code == 401
    # 415 before 400
    assert post(stack, b"not json", headers={"Content-Encoding": "br"}).status_code == 415
    # 400 (schema) before 403 (allowlist)
    assert post(stack, decision("nimble", state=5), key=narrow).status_code == 400
    # 403 before 404: a disallowed model that does not exist is still 403
    assert post(stack, decision("ghost"), key=narrow).status_code == 403
    # 404 before 413 (text limit)
    assert post(stack, decision("ghost", state="w " * 33_000)).status_code == 404
    # 413 (text) before 400 (capability)
    assert post(stack, decision("llama3.2", state="w " * 33_000)).status_code == 413
    # 403, 404 and 413 (text) before the remote-media 400 (a media check)
    remote = ["https://example.com/cat.png"]
    assert post(stack, decision("clef", images=remote), key=narrow).status_code == 400
    assert post(stack, decision("nimble", images=remote), key=narrow).status_code == 403
    assert post(stack, decision("ghost", images=remote)).status_code == 404
    assert post(stack, decision("clef", images=remote, state="w " * 33_000)).status_code == 413


def test_a_declared_length_over_the_cap_comes_before_the_encoding(stack: Stack) -> None:
    """SPEC §1: 413/415 in the order length, encoding, body cap."""
    answer = head_only(stack.gateway.port, f"Authorization: Bearer {stack.project_key}\r\nContent-Encoding: br\r\n")
    assert answer.startswith(b"HTTP/1.1 413"), answer


# -- 5xx ---------------------------------------------------------------------------------

def test_unreachable_backend_is_502_then_503_while_backed_off(stack: Stack) -> None:
    stack.ollama.stop()
    assert_error(post(stack, decision()), 502)
    response = post(stack, decision())
    assert_error(response, 503)
    assert int(response.headers["retry-after"]) >= 1


@pytest.mark.parametrize("fault", ["drop_connection", "non_json", "reset_mid_body"])
def test_broken_answers_are_502(stack: Stack, fault: str) -> None:
    setattr(stack.ollama_state.faults, fault, True)
    assert_error(post(stack, decision()), 502)


def test_an_answer_over_the_response_cap_is_502(stack: Stack, gateway_factory: Any) -> None:
    capped = gateway_factory(max_response_bytes=100_000)
    stack.ollama_state.faults.huge_body_bytes = 1_000_000
    with capped.client(stack.project_key) as client:
        assert_error(client.post("/v1/systemone", json=decision()), 502)


def test_a_json_answer_that_is_not_an_object_is_502(stack: Stack) -> None:
    stack.ollama_state.faults.status = 200
    stack.ollama_state.faults.body = b"[1, 2]"
    stack.ollama_state.faults.content_type = "application/json"
    assert "not a JSON object" in assert_error(post(stack, decision()), 502)["error"]


def test_a_slow_backend_is_504_within_the_timeout(stack: Stack, gateway_factory: Any) -> None:
    impatient = gateway_factory(backend_timeout=0.5)
    stack.ollama_state.faults.latency = 5
    with impatient.client(stack.project_key) as client:
        response = client.post("/v1/systemone", json=decision())
    assert_error(response, 504)
    assert response.elapsed.total_seconds() < 3


def test_arbiters_own_credential_rejected_is_500(db: Any, vllm: Any, gateway_factory: Any) -> None:
    server, state = vllm
    state.required_bearer = "backend-secret"

    built = Stack.provision(db)
    add_service(db, type="vllm", url=server.url, name="guarded", credential="backend-secret")
    built.gateway = gateway_factory()
    assert post(built, decision("Qwen/Qwen3-0.6B")).status_code == 200
    state.required_bearer = "rotated-elsewhere"
    response = post(built, decision("Qwen/Qwen3-0.6B"))
    error = assert_error(response, 500, "upstream_auth_error")
    assert "backend-secret" not in response.text and "guarded" in error["error"]


def test_the_gateway_serves_the_next_request_after_failures(stack: Stack) -> None:
    stack.ollama_state.faults.non_json = True
    assert post(stack, decision()).status_code == 502
    stack.ollama_state.faults.reset()
    assert post(stack, decision()).status_code == 200
