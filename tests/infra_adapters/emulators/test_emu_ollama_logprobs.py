"""The Ollama emulator's logprobs and thinking switches, as Ollama's source has them:
server/routes.go ChatHandler (top_logprobs 0..20, else 400; "does not support thinking"),
api/types.go (ThinkValue, TokenLogprob, Logprob), server/logprob.go (bytes),
openai/openai.go (thinkFromReasoningEffort, ChoiceLogprobs, ToChatCompletion)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from infra_adapters.emulators.ollama import OllamaState

PROMPT = "My card was charged twice.\n\nWhich team?\nAnswer with one label only: A, B, C."
MESSAGES = [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": "Answer:"}]
V1 = "/v1/chat/completions"


def _read(**extra: Any) -> dict[str, Any]:
    """What Arbiter's label reader sends (infra_adapters/openai_logprobs.py)."""
    return {"model": "llama3.2", "messages": MESSAGES, "max_tokens": 1, "temperature": 0,
            "logprobs": True, "top_logprobs": 20, "stream": False, **extra}


def _openai_error(resp: httpx.Response, status: int, message: str) -> None:
    assert resp.status_code == status, resp.text
    assert resp.json() == {"error": {"message": message, "type": "invalid_request_error",
                                     "param": None, "code": None}}


@pytest.mark.parametrize("top", [21, 100, -1])
@pytest.mark.parametrize("model", ["llama3.2", "not-installed"])  # checked before the model is looked up
def test_top_logprobs_over_20_is_a_400_not_clamped(ollama_client: httpx.Client, top: int, model: str) -> None:
    _openai_error(ollama_client.post(V1, json=_read(model=model, top_logprobs=top)), 400,
                  "top_logprobs must be between 0 and 20")
    native = ollama_client.post("/api/chat", json=_read(model=model, top_logprobs=top))
    assert (native.status_code, native.json()) == (400, {"error": "top_logprobs must be between 0 and 20"})


def test_top_logprobs_that_is_not_an_int_fails_decoding(ollama_client: httpx.Client) -> None:
    _openai_error(ollama_client.post(V1, json=_read(top_logprobs="5")), 400,
                  "json: cannot unmarshal string into Go struct field ChatCompletionRequest.top_logprobs of type int")
    native = ollama_client.post("/api/chat", json=_read(top_logprobs=2.5))
    assert native.json() == {
        "error": "json: cannot unmarshal number 2.5 into Go struct field ChatRequest.top_logprobs of type int"}


def test_openai_logprobs_have_ollamas_shape(ollama_client: httpx.Client) -> None:
    resp = ollama_client.post(V1, json=_read())
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    assert list(answer) == ["id", "object", "created", "model", "system_fingerprint", "choices", "usage"]
    assert answer["system_fingerprint"] == "fp_ollama" and answer["object"] == "chat.completion"
    assert set(answer["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}
    (choice,) = answer["choices"]
    assert list(choice) == ["index", "message", "finish_reason", "logprobs"]  # no stop_reason
    (first,) = choice["logprobs"]["content"]
    assert choice["message"] == {"role": "assistant", "content": first["token"]}  # no refusal, reasoning_content
    assert first["token"] in ("A", "B", "C")
    assert list(first) == ["token", "logprob", "bytes", "top_logprobs"]
    assert first["bytes"] == list(first["token"].encode())
    assert len(first["top_logprobs"]) == 8  # every token the emulator ranks (3 labels, 5 fillers) < 20
    for entry in first["top_logprobs"]:
        assert list(entry) == ["token", "logprob", "bytes"]  # api.TokenLogprob
        assert entry["bytes"] == list(entry["token"].encode())
    assert first["top_logprobs"][0]["token"] == first["token"]
    ranked = [e["logprob"] for e in first["top_logprobs"]]
    assert ranked == sorted(ranked, reverse=True)
    two = ollama_client.post(V1, json=_read(top_logprobs=2)).json()["choices"][0]["logprobs"]["content"][0]
    assert two["top_logprobs"] == first["top_logprobs"][:2]


def test_top_logprobs_0_has_no_list_and_top_logprobs_alone_asks_for_nothing(ollama_client: httpx.Client) -> None:
    (first,) = ollama_client.post(V1, json=_read(top_logprobs=0)).json()["choices"][0]["logprobs"]["content"]
    assert list(first) == ["token", "logprob", "bytes"]  # omitempty
    plain = ollama_client.post(V1, json=_read(logprobs=None, top_logprobs=5)).json()
    assert "logprobs" not in plain["choices"][0]


def test_native_chat_logprobs(ollama_client: httpx.Client) -> None:
    body = {"model": "llama3.2", "messages": [{"role": "user", "content": "hello there"}], "stream": False}
    assert "logprobs" not in ollama_client.post("/api/chat", json=body).json()
    answer = ollama_client.post("/api/chat", json={**body, "logprobs": True, "top_logprobs": 3}).json()
    assert list(answer)[:6] == ["model", "created_at", "message", "done_reason", "done", "logprobs"]
    assert "".join(e["token"] for e in answer["logprobs"]) == answer["message"]["content"]
    assert answer["eval_count"] == len(answer["logprobs"])
    for entry in answer["logprobs"]:
        assert list(entry) == ["token", "logprob", "bytes", "top_logprobs"]
        assert entry["bytes"] == list(entry["token"].encode()) and len(entry["top_logprobs"]) == 3
    lines = [json.loads(line) for line in ollama_client.post(
        "/api/chat", json={**body, "stream": True, "logprobs": True}).text.splitlines()]
    *chunks, last = lines
    assert all(len(c["logprobs"]) == 1 and c["logprobs"][0]["token"] == c["message"]["content"] for c in chunks)
    assert all("top_logprobs" not in c["logprobs"][0] for c in chunks)
    assert last["done"] is True and "logprobs" not in last


@pytest.mark.parametrize(
    ("think", "status", "message"),
    [
        (False, 200, None),  # off is fine for any model
        (None, 200, None),
        (True, 400, '"llama3.2" does not support thinking'),
        ("high", 400, '"llama3.2" does not support thinking'),
        ("max", 400, '"llama3.2" does not support thinking'),
        ("none", 400, 'invalid think value: "none" (must be "high", "medium", "low", "max", true, or false)'),
        (1, 400, 'think must be a boolean or string ("high", "medium", "low", "max", true, or false)'),
    ],
)
def test_native_think(ollama_client: httpx.Client, think: Any, status: int, message: str | None) -> None:
    resp = ollama_client.post("/api/chat", json={"model": "llama3.2", "messages": MESSAGES, "stream": False,
                                                 "think": think})
    assert resp.status_code == status, resp.text
    if message is not None:
        assert resp.json() == {"error": message}


@pytest.mark.parametrize(
    ("extra", "status", "message"),
    [
        ({"reasoning_effort": "none"}, 200, None),
        ({"think": True}, 200, None),  # not a field of the OpenAI request: ignored
        ({"reasoning": {"effort": "none"}, "reasoning_effort": "high"}, 200, None),  # reasoning wins
        ({"reasoning_effort": "high"}, 400, '"llama3.2" does not support thinking'),
        ({"reasoning_effort": "minimal"}, 400, '"llama3.2" does not support thinking'),
        ({"reasoning_effort": "xhigh"}, 400, '"llama3.2" does not support thinking'),
        ({"reasoning": {"effort": "low"}}, 400, '"llama3.2" does not support thinking'),
        ({"reasoning_effort": "off"}, 400, ('invalid reasoning value: "off" (must be "minimal", "low", "medium", '
                                            '"high", "xhigh", "ultra", "max", or "none")')),
    ],
)
def test_openai_reasoning_effort(ollama_client: httpx.Client, extra: dict[str, Any], status: int,
                                 message: str | None) -> None:
    resp = ollama_client.post(V1, json={"model": "llama3.2", "messages": MESSAGES, **extra})
    if message is None:
        assert resp.status_code == status, resp.text
    else:
        _openai_error(resp, status, message)


def test_a_thinking_model_takes_every_effort(ollama_client: httpx.Client, ollama: OllamaState) -> None:
    ollama.models["qwen3:0.6b"] = ["completion", "tools", "thinking"]
    for effort in ("none", "minimal", "low", "medium", "high", "max", "xhigh", "ultra"):
        resp = ollama_client.post(V1, json=_read(model="qwen3:0.6b", reasoning_effort=effort))
        assert resp.status_code == 200, (effort, resp.text)
    for think in (True, False, "low", "max"):
        resp = ollama_client.post("/api/chat", json=_read(model="qwen3:0.6b", think=think))
        assert resp.status_code == 200, (think, resp.text)
