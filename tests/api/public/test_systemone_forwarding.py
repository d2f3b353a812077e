"""POST /v1/systemone: what reaches the backend and what comes back (SPEC §1)."""

from __future__ import annotations

import gzip
import json
from typing import Any

import httpx
import orjson
import pytest
import zstandard

from infra_adapters.emulators.server import EmulatorServer
from infra_adapters.emulators.vllm import VllmState
from tests.support import Stack, decision


def decisions_seen(state: Any) -> list[Any]:
    return [r for r in state.requests if r.path == "/v1/systemone"]


def test_answer_comes_back_with_public_name_and_coherent_probabilities(stack: Stack) -> None:
    with stack.client() as client:
        response = client.post("/v1/systemone", json=decision())
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == "nimble"
    assert list(body["answers"]) == ["team", "urgent", "tone"]
    team = body["answers"]["team"]
    assert team["choice"] == max(team["probabilities"], key=team["probabilities"].get)
    assert sum(team["probabilities"].values()) == pytest.approx(1)
    assert 0 <= body["answers"]["urgent"]["noul"] <= 1
    tone = body["answers"]["tone"]
    assert tone["legend"] == {"0": "calm", "1": "annoyed", "2": "furious"}
    assert tone["score"] == pytest.approx(sum(int(k) * p for k, p in tone["probabilities"].items()))
    assert body["usage"]["output_tokens"] == 3 and body["usage"]["input_tokens"] > 0
    # The backend was asked for its own name for the model.
    assert decisions_seen(stack.ollama_state)[-1].json["model"] == "nimble:latest"


def test_only_model_is_rewritten_in_the_answer(stack: Stack) -> None:
    """The body Arbiter returns is the backend's body but for `model`."""
    with stack.client() as client:
        through = client.post("/v1/systemone", json=decision()).json()
    direct = httpx.post(stack.ollama.url + "/v1/systemone", json=decision(model="nimble:latest")).json()
    assert through.pop("model") == "nimble" and direct.pop("model") == "nimble:latest"
    assert through == direct


def test_question_order_unknown_fields_and_exact_numbers_reach_the_backend(stack: Stack) -> None:
    questions = {name: {"type": "noul", "instructions": f"Is it {name}?", "x-trace": {"n": 1.10}}
                 for name in ["zeta", "alpha", "mid", "beta"]}
    raw = json.dumps({"model": "nimble", "state": "s", "questions": questions,
                      "options": {"temperature": "T", "seed": "S"}, "keep_alive": "5m"})
    raw = raw.replace('"T"', "0.10").replace('"S"', "123456789012345678901234567890").replace("1.1", "1.10")
    with stack.client() as client:
        response = client.post("/v1/systemone", content=raw)
    assert response.status_code == 200, response.text
    assert list(response.json()["answers"]) == ["zeta", "alpha", "mid", "beta"]
    seen = decisions_seen(stack.ollama_state)[-1]
    assert list(seen.json["questions"]) == ["zeta", "alpha", "mid", "beta"]
    assert seen.json["questions"]["zeta"]["x-trace"] == {"n": 1.1}
    assert seen.json["keep_alive"] == "5m"
    # Numbers keep their exact text: no float rounding, no 64-bit overflow.
    assert b'"temperature":0.10' in seen.body
    assert b"123456789012345678901234567890" in seen.body
    assert b'"n":1.10' in seen.body


@pytest.mark.parametrize("encoding", ["gzip", "zstd", "identity"])
def test_compressed_bodies_are_accepted(stack: Stack, encoding: str) -> None:
    raw = orjson.dumps(decision())
    data = {"gzip": gzip.compress, "zstd": zstandard.ZstdCompressor().compress,
            "identity": lambda b: b}[encoding](raw)
    with stack.client() as client:
        response = client.post("/v1/systemone", content=data, headers={"Content-Encoding": encoding})
    assert response.status_code == 200, response.text
    assert decisions_seen(stack.ollama_state)[-1].json["questions"] == decision()["questions"]


def test_backend_errors_pass_through_byte_for_byte(stack: Stack) -> None:
    # A one-option choice: Arbiter accepts it (1..255), this Ollama refuses it with its own 400.
    body = decision(questions={"q": {"type": "choice", "criteria": {"only": None}}})
    direct = httpx.post(stack.ollama.url + "/v1/systemone", json={**body, "model": "nimble:latest"})
    with stack.client() as client:
        through = client.post("/v1/systemone", json=body)
    assert direct.status_code == 400
    assert through.status_code == direct.status_code
    assert through.content == direct.content
    assert through.headers["content-type"] == direct.headers["content-type"]


def test_injected_backend_status_passes_through(stack: Stack) -> None:
    stack.ollama_state.faults.status = 429
    stack.ollama_state.faults.body = b'{"error":"server busy, please try again"}'
    stack.ollama_state.faults.content_type = "application/json; charset=utf-8"
    with stack.client() as client:
        response = client.post("/v1/systemone", json=decision())
    assert response.status_code == 429
    assert response.content == b'{"error":"server busy, please try again"}'
    assert "retry-after" not in response.headers  # the backend gave none: none is made up


@pytest.mark.parametrize("status", [429, 503])
def test_a_backend_errors_retry_after_comes_back_with_it(stack: Stack, status: int) -> None:
    faults = stack.ollama_state.faults
    faults.status, faults.body, faults.content_type = status, b'{"error":"busy"}', "application/json"
    faults.headers = {"Retry-After": "17"}
    with stack.client() as client:
        response = client.post("/v1/systemone", json=decision())
    assert response.status_code == status
    assert response.content == b'{"error":"busy"}'
    assert response.headers["retry-after"] == "17"


def test_trace_headers_are_forwarded(stack: Stack) -> None:
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with stack.client() as client:
        response = client.post("/v1/systemone", json=decision(),
                               headers={"traceparent": parent, "tracestate": "congo=t61rcWkgMzE"})
    assert response.status_code == 200
    seen = decisions_seen(stack.ollama_state)[-1]
    assert seen.header("traceparent") == parent
    assert seen.header("tracestate") == "congo=t61rcWkgMzE"
    assert seen.header("authorization") is None  # the tenant's key never reaches the backend


def test_request_id_is_returned(stack: Stack) -> None:
    with stack.client() as client:
        generated = client.post("/v1/systemone", json=decision())
        chosen = client.post("/v1/systemone", json=decision(), headers={"X-Request-Id": "abc-123"})
    assert len(generated.headers["x-request-id"]) >= 16
    assert chosen.headers["x-request-id"] == "abc-123"


def test_vllm_answer_keeps_its_own_fields(vllm_stack: Stack) -> None:
    with vllm_stack.client() as client:
        response = client.post("/v1/systemone", json=decision("Qwen/Qwen3-0.6B", keep_alive="5m"))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == "Qwen/Qwen3-0.6B"
    assert body["object"] == "structured_decision" and body["id"].startswith("decision-")
    assert isinstance(body["created"], int) and set(body["diagnostics"]) == {"team", "urgent", "tone"}
    seen = decisions_seen(vllm_stack.extra["state"])[-1].json
    assert "keep_alive" not in seen  # vLLM does not know it


def test_vllm_unknown_question_field_is_its_own_400(vllm_stack: Stack) -> None:
    body = decision("Qwen/Qwen3-0.6B")
    body["questions"]["team"]["weight"] = 2
    with vllm_stack.client() as client:
        response = client.post("/v1/systemone", json=body)
    direct = httpx.post(vllm_stack.extra["server"].url + "/v1/systemone", json=body)
    assert response.status_code == 400
    assert response.content == direct.content
    assert "error" in response.json() and "message" in response.json()["error"]


def test_vllm_cache_salt_is_per_project(vllm_stack: Stack) -> None:
    other_key = vllm_stack.new_project("globex")
    with vllm_stack.client() as acme, vllm_stack.gateway.client(other_key) as globex:
        assert acme.post("/v1/systemone", json=decision("Qwen/Qwen3-0.6B")).status_code == 200
        assert acme.post("/v1/systemone", json=decision("Qwen/Qwen3-0.6B")).status_code == 200
        assert globex.post("/v1/systemone", json=decision("Qwen/Qwen3-0.6B")).status_code == 200
        mine = decision("Qwen/Qwen3-0.6B", cache_salt="my-own-salt")
        assert globex.post("/v1/systemone", json=mine).status_code == 200
    salts = [r.json["cache_salt"] for r in decisions_seen(vllm_stack.extra["state"])]
    assert salts[0] == salts[1]  # stable for one project
    assert salts[2] != salts[0]  # another project, another salt
    assert salts[3] not in (salts[2], "my-own-salt")  # the caller's salt is combined, not trusted


def test_vllm_media_is_sent_as_data_urls(db: Any, gateway_factory: Any) -> None:
    state = VllmState(models={"vision-model": {"read_strategy": True, "max_model_len": 4096, "media": ["images"]}})
    from infra_adapters.emulators.vllm import make_vllm_app

    with EmulatorServer(make_vllm_app(state)) as server:
        built = Stack.provision(db, vllm_url=server.url)
        # An admin declares the model as taking images: a custom row, which the gateway's start-up
        # sync of the service keeps (a synced row gets the server's capabilities back, racing the
        # request below).
        with db.session() as session:
            from sqlalchemy import update

            from app.db.models import Model
            session.execute(update(Model).values(capabilities=["completion", "decision", "vision"],
                                                 source="custom"))
        gateway = gateway_factory()
        png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
        with gateway.client(built.project_key) as client:
            response = client.post("/v1/systemone", json=decision("vision-model", images=[png]))
    assert response.status_code == 200, response.text
    sent = [r for r in state.requests if r.path == "/v1/systemone"][-1].json
    assert sent["images"] == ["data:image/png;base64," + png]


def test_ollama_python_client(stack: Stack) -> None:
    import ollama

    client = ollama.Client(host=stack.gateway.url, headers={"Authorization": f"Bearer {stack.project_key}"})
    result = client.systemone(
        model="nimble", state={"ticket": "Checkout returns 500 since 9am."},
        questions={"label": {"type": "choice", "instructions": "Which label fits?",
                             "criteria": {"billing": "Payments", "bug": "Software errors", "account": None}}},
    )
    assert result.model == "nimble"
    answer = result.answers["label"]
    assert answer.choice in {"billing", "bug", "account"}
    assert sum(answer.probabilities.values()) == pytest.approx(1)
    with pytest.raises(ollama.ResponseError) as info:
        ollama.Client(host=stack.gateway.url, headers={"Authorization": "Bearer arb_proj_nope"}).systemone(
            model="nimble", state="x", questions={"q": {"type": "noul", "instructions": "?"}})
    assert info.value.status_code == 401


def test_a_backend_redirect_is_not_followed(stack: Stack) -> None:
    """Following it would re-send the tenant's body to a URL of the backend's choosing."""
    from infra_adapters.emulators.ollama import OllamaState, make_ollama_app

    elsewhere = OllamaState()
    with EmulatorServer(make_ollama_app(elsewhere)) as other:
        stack.ollama_state.faults.status = 307
        stack.ollama_state.faults.body = b""
        stack.ollama_state.faults.headers = {"Location": other.url + "/v1/systemone"}
        with stack.client() as client:
            response = client.post("/v1/systemone", json=decision())
    assert response.status_code == 307
    assert not [r for r in elsewhere.requests if r.path == "/v1/systemone"]


def test_an_answer_whose_model_does_not_lead_comes_back_byte_for_byte(stack: Stack) -> None:
    """As a vLLM answer is laid out (id first): only the model's value changes, numbers and
    spacing stay the backend's."""
    faults = stack.ollama_state.faults
    faults.status, faults.content_type = 200, "application/json"
    faults.body = (b'{"id": "d-1", "model": "nimble:latest", "answers": {"q": {"noul": 0.50}},\n'
                   b' "big": 123456789012345678901234, "usage": {"input_tokens": 5, "output_tokens": 1}}')
    with stack.client() as client:
        response = client.post("/v1/systemone", json=decision())
    assert response.status_code == 200, response.text
    assert response.content == faults.body.replace(b'"model": "nimble:latest"', b'"model": "nimble"')


# Instructions and descriptions of every JSON kind (SPEC §1), written as a client writes them.
STRUCTURED_QUESTIONS = (
    b'{"team":{"type":"choice","instructions":{"ask":"Which team?","weights":[1,2.50,-0.0,1e3]},'
    b'"criteria":{"billing":{"covers":["refunds","Caf\xc3\xa9"]},"shipping":null,"legal":0,"other":[true,false]}},'
    b'"urgent":{"type":"noul","instructions":["within","the","hour"],"criteria":{"true":{"n":1},"false":7.0}},'
    b'"tone":{"type":"score","instructions":123456789012345678901234567890,'
    b'"criteria":[{"calm":null},false,3.10,"furious"]},'
    b'"bare":{"type":"noul","instructions":null,"criteria":{"true":null}}}'
)


def _post_structured(stack: Stack, model: str) -> tuple[bytes, dict[str, Any]]:
    raw = b'{"model":"' + model.encode() + b'","state":"s","questions":' + STRUCTURED_QUESTIONS + b"}"
    with stack.client() as client:
        response = client.post("/v1/systemone", content=raw)
    assert response.status_code == 200, response.text
    answers = response.json()["answers"]
    assert list(answers) == ["team", "urgent", "tone", "bare"]
    return raw, answers


def test_structured_text_reaches_ollama_as_written(stack: Stack) -> None:
    """Nothing but ``model`` is rewritten: the questions' bytes arrive as the caller wrote them."""
    raw, answers = _post_structured(stack, "nimble")
    assert decisions_seen(stack.ollama_state)[-1].body == raw.replace(b'"nimble"', b'"nimble:latest"')
    assert answers["tone"]["legend"]["0"] == {"calm": None}  # Ollama's legend: the level as it came


def test_structured_text_reaches_vllm_as_written(vllm_stack: Stack) -> None:
    raw, answers = _post_structured(vllm_stack, "Qwen/Qwen3-0.6B")
    seen = decisions_seen(vllm_stack.extra["state"])[-1].body
    assert seen.startswith(raw[:-1] + b',"cache_salt":"')  # vLLM's dialect adds the project's salt only
    assert answers["tone"]["legend"]["0"] == "{'calm': None}"  # vLLM names a level with str()
