"""The vLLM emulator's `/v1/chat/completions` and `/v1/embeddings`, and `task`."""

from __future__ import annotations

import math
import re
from typing import Any

import httpx
import orjson
import pytest

from infra_adapters.emulators import embedding_vector
from infra_adapters.emulators.vllm import VllmState

from .streams import sse_data, timed_lines

MODEL = "Qwen/Qwen3-0.6B"
EMBEDDER = "BAAI/bge-m3"
MESSAGES = [{"role": "user", "content": "Summarise the ticket please"}]
REPLY = "Echo: Summarise the ticket please"


def _error(resp: httpx.Response, status: int, err_type: str) -> str:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"]) == (err_type, status)
    return str(error["message"])


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": MESSAGES, **extra}


def test_chat_completion(vllm_client: httpx.Client) -> None:
    resp = vllm_client.post("/v1/chat/completions", json=_chat(max_tokens=100))
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "application/json"
    data = resp.json()
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{32}", data["id"])
    assert (data["object"], data["model"]) == ("chat.completion", MODEL)
    # chat_completion/protocol.py ChatCompletionResponse as vLLM dumps it
    assert set(data) == {"id", "object", "created", "model", "choices", "service_tier", "system_fingerprint",
                         "usage", "prompt_logprobs", "prompt_token_ids", "prompt_text", "kv_transfer_params",
                         "ec_transfer_params", "metrics"}
    (choice,) = data["choices"]
    assert set(choice) == {"index", "message", "logprobs", "finish_reason", "stop_reason", "token_ids",
                           "routed_experts", "weight_versions"}
    # ChatMessage: the reasoning is `reasoning`; an empty `tool_calls` is left out
    assert choice["message"] == {"role": "assistant", "content": REPLY, "refusal": None, "annotations": None,
                                 "audio": None, "function_call": None, "reasoning": None}
    assert choice["finish_reason"] == "stop" and choice["index"] == 0 and choice["logprobs"] is None
    usage = data["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["prompt_tokens_details"] is None and usage["completion_tokens_details"] is None
    default_model = vllm_client.post("/v1/chat/completions", json={"messages": MESSAGES})
    assert default_model.json()["model"] == MODEL
    short = vllm_client.post("/v1/chat/completions", json=_chat(max_tokens=1)).json()
    assert short["choices"][0]["finish_reason"] == "length"
    assert short["usage"]["completion_tokens"] == 1
    # OpenAIBaseModel allows unknown fields (they are ignored)
    assert vllm_client.post("/v1/chat/completions", json=_chat(keep_alive=5, unknown=1)).status_code == 200


def test_chat_stream_is_sse_ending_with_done(vllm_client: httpx.Client, vllm: VllmState) -> None:
    vllm.stream_delay = 0.05
    resp, lines = timed_lines(vllm_client, "/v1/chat/completions", _chat(stream=True))
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    assert lines[-1][1] == "data: [DONE]"
    assert lines[-1][0] - lines[0][0] >= 0.2  # paced, not one write
    chunks = [orjson.loads(line[len("data: ") :]) for _, line in lines[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks) == REPLY
    assert [c["choices"][0]["finish_reason"] for c in chunks][-2:] == [None, "stop"]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)

    vllm.stream_delay = 0.0
    body = _chat(stream=True, stream_options={"include_usage": True})
    data = sse_data(vllm_client.post("/v1/chat/completions", json=body).text)
    assert data[-1] == "[DONE]"
    usage = orjson.loads(data[-2])
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] > 0


def _refused(resp: httpx.Response, message: str, param: str | None = None, status: int = 400,
             err_type: str = "BadRequestError") -> None:
    assert resp.status_code == status, resp.text
    assert resp.json() == {"error": {"message": message, "type": err_type, "param": param, "code": status}}


def test_chat_errors(vllm_client: httpx.Client, vllm: VllmState) -> None:
    _refused(vllm_client.post("/v1/chat/completions", json=_chat(model="x")),
             f"The model `x` does not exist. Valid aliases: {MODEL}.", "model", 404, "NotFoundError")
    _refused(vllm_client.post("/v1/chat/completions", json={"model": MODEL}),
             "1 validation error:\n  {'type': 'missing', 'loc': 'body.messages', 'msg': 'Field required', "
             "'input': '<dict of 1 items>'}", "body.messages", err_type="Bad Request")
    _refused(vllm_client.post("/v1/chat/completions", json=_chat(max_tokens="x")),
             "1 validation error:\n  {'type': 'int_parsing', 'loc': 'body.max_tokens', 'msg': 'Input should be a "
             "valid integer, unable to parse string as an integer', 'input': 'x'}", "body.max_tokens",
             err_type="Bad Request")
    _refused(vllm_client.post("/v1/chat/completions", json=_chat(stream_options={"include_usage": True})),
             "Stream options can only be defined when `stream=True`. (parameter=stream_options)", "stream_options")
    _refused(vllm_client.post("/v1/chat/completions", json=_chat(tools=[])),
             "`tools` must not be an empty array. Either provide at least one tool or omit the field entirely. "
             "(parameter=tools)", "tools")
    _refused(vllm_client.post("/v1/chat/completions", json=_chat(max_tokens=0)),
             "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)", "max_tokens")
    _refused(vllm_client.post("/v1/chat/completions", json=_chat(max_tokens=5000)),
             "max_tokens=5000 cannot be greater than max_model_len=4096. Please request fewer output tokens. "
             "(parameter=max_tokens, value=5000)", "max_tokens")
    vllm.models[MODEL]["max_model_len"] = 8
    long = _chat(messages=[{"role": "user", "content": "word " * 20}])
    _refused(vllm_client.post("/v1/chat/completions", json=long),
             "This model's maximum context length is 8 tokens. However, your prompt contains at least 9 input "
             "tokens, which exceeds this limit even without any output tokens. Please reduce the length of the "
             "input prompt. (parameter=input_tokens, value=9)", "input_tokens")


def test_task_embed(vllm_client: httpx.Client, vllm: VllmState) -> None:
    vllm.models[EMBEDDER] = {"task": "embed", "max_model_len": 8192}
    resp = vllm_client.post("/v1/embeddings", json={"model": EMBEDDER, "input": ["x", "y"]})
    assert resp.status_code == 200
    data = resp.json()
    assert data["object"] == "list" and data["model"] == EMBEDDER
    assert re.fullmatch(r"embd-[0-9a-f]+", data["id"])
    vectors = [d["embedding"] for d in data["data"]]
    assert vectors == [embedding_vector("x"), embedding_vector("y")]
    assert all(math.sqrt(sum(v * v for v in vec)) == pytest.approx(1.0) for vec in vectors)
    assert data["usage"]["prompt_tokens"] == 2 and data["usage"]["completion_tokens"] == 0
    again = vllm_client.post("/v1/embeddings", json={"model": EMBEDDER, "input": "x"}).json()
    assert again["data"][0]["embedding"] == vectors[0]

    decision = {"model": EMBEDDER, "state": "s", "questions": {"q": {"type": "noul"}}}
    _error(vllm_client.post("/v1/systemone", json=decision), 501, "NotImplementedError")
    # a model without the handler: the routers raise NotImplementedError, a 501
    chat = vllm_client.post("/v1/chat/completions", json=_chat(model=EMBEDDER))
    assert _error(chat, 501, "NotImplementedError") == "The model does not support Chat Completions API"
    generate = vllm_client.post("/v1/embeddings", json={"model": MODEL, "input": "x"})
    assert _error(generate, 501, "NotImplementedError") == "The model does not support Embeddings API"
    no_input = vllm_client.post("/v1/embeddings", json={"model": EMBEDDER})
    _error(no_input, 400, "BadRequestError")


def test_api_key_guards_chat_and_faults_apply(vllm_client: httpx.Client, vllm: VllmState) -> None:
    vllm.required_bearer = "sk-test"
    assert vllm_client.post("/v1/chat/completions", json=_chat()).status_code == 401
    auth = {"Authorization": "Bearer sk-test"}
    assert vllm_client.post("/v1/chat/completions", json=_chat(), headers=auth).status_code == 200
    vllm.faults.status = 500
    assert vllm_client.post("/v1/chat/completions", json=_chat(), headers=auth).status_code == 500
