"""The Ollama emulator's chat and embeddings, native and OpenAI-compatible."""

from __future__ import annotations

import base64
import itertools
import math
import re
import struct
from typing import Any

import httpx
import orjson
import pytest

from infra_adapters.emulators import embedding_vector, reply_text
from infra_adapters.emulators.generation import EMBEDDING_DIM
from infra_adapters.emulators.ollama import OllamaState

from .streams import ndjson, sse_data, timed_lines

QUESTION = "Where is my parcel? It was due on Monday and it still has not arrived."
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "hello"},
    {"role": "assistant", "content": "hi"},
    {"role": "user", "content": QUESTION},
]
REPLY = "Echo: " + QUESTION[:40]
EMBEDDER = "nomic-embed-text"


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": "llama3.2", "messages": MESSAGES, **extra}


def test_reply_is_derived_from_the_last_user_message() -> None:
    assert reply_text(MESSAGES) == REPLY
    assert reply_text([{"role": "user", "content": [{"type": "text", "text": "hi"}]}]) == (
        "Echo: hi"
    )


def test_chat_stream_chunks_arrive_one_by_one(
    ollama_client: httpx.Client, ollama: OllamaState
) -> None:
    ollama.stream_delay = 0.08
    resp, lines = timed_lines(ollama_client, "/api/chat", _chat())
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "application/x-ndjson"
    chunks = [orjson.loads(line) for _, line in lines]
    *pieces, final = chunks
    assert 3 <= len(pieces) <= 5
    for chunk in pieces:
        assert set(chunk) == {"model", "created_at", "message", "done"}
        assert chunk["model"] == "llama3.2" and chunk["done"] is False
        assert chunk["message"]["role"] == "assistant" and chunk["message"]["content"]
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z", chunk["created_at"])
    assert "".join(c["message"]["content"] for c in pieces) == REPLY
    assert final["done"] is True and final["done_reason"] == "stop"
    assert final["message"] == {"role": "assistant", "content": ""}
    assert final["eval_count"] == len(pieces) and final["prompt_eval_count"] > 0
    assert final["total_duration"] > 0
    times = [t for t, _ in lines]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # each chunk is its own write, stream_delay apart (not buffered into one)
    assert all(gap >= 0.02 for gap in gaps), gaps
    assert times[-1] - times[0] >= 0.3


def test_chat_without_stream(ollama_client: httpx.Client) -> None:
    resp = ollama_client.post("/api/chat", json=_chat(stream=False, options={"temperature": 0}))
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "application/json; charset=utf-8"
    data = resp.json()
    assert data["message"] == {"role": "assistant", "content": REPLY}
    assert (data["done"], data["done_reason"], data["model"]) == (True, "stop", "llama3.2")
    assert data["eval_count"] == 5 and data["prompt_eval_count"] > 0


def test_chat_num_predict_and_load(ollama_client: httpx.Client) -> None:
    short = ollama_client.post(
        "/api/chat", json=_chat(stream=False, options={"num_predict": 2})
    ).json()
    assert short["done_reason"] == "length" and short["eval_count"] == 2
    assert REPLY.startswith(short["message"]["content"]) and short["message"]["content"] != REPLY
    load = ollama_client.post("/api/chat", json={"model": "llama3.2", "messages": []}).json()
    assert load["done_reason"] == "load" and load["done"] is True


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"model": "nimble", "messages": MESSAGES}, 400, '"nimble" does not support chat'),
        ({"model": "x", "messages": MESSAGES}, 404, 'model "x" not found, try pulling it first'),
        ({"messages": MESSAGES}, 400, "model is required"),
        (_chat(think=True), 400, '"llama3.2" does not support thinking'),
        (_chat(keep_alive="soon"), 400, 'time: invalid duration "soon"'),
        ({"model": "llama3.2", "messages": "hi"}, 400, "json: cannot unmarshal string"),
    ],
)
def test_chat_errors(
    ollama_client: httpx.Client, body: dict[str, Any], status: int, message: str
) -> None:
    resp = ollama_client.post("/api/chat", json=body)
    assert resp.status_code == status, resp.text
    assert resp.json() == {"error": resp.json()["error"]}
    assert message in resp.json()["error"]


def test_faults_apply_to_chat(ollama_client: httpx.Client, ollama: OllamaState) -> None:
    ollama.faults.status = 503
    assert ollama_client.post("/api/chat", json=_chat()).status_code == 503
    assert ollama_client.post("/v1/chat/completions", json=_chat()).status_code == 503
    assert ollama_client.post("/api/embed", json={"model": EMBEDDER}).status_code == 503
    ollama.faults.reset()
    ollama.faults.reset_mid_body = True
    with pytest.raises(httpx.RemoteProtocolError):
        ollama_client.post("/api/chat", json=_chat())
    assert ollama.faults.applied >= 4


def test_openai_chat_completion(ollama_client: httpx.Client) -> None:
    resp = ollama_client.post("/v1/chat/completions", json=_chat())
    assert resp.status_code == 200
    data = resp.json()
    assert re.fullmatch(r"chatcmpl-\d+", data["id"])
    assert data["object"] == "chat.completion" and isinstance(data["created"], int)
    assert data["model"] == "llama3.2"
    assert data["choices"] == [
        {"index": 0, "message": {"role": "assistant", "content": REPLY}, "finish_reason": "stop"}
    ]
    usage = data["usage"]
    assert usage["completion_tokens"] == 5
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_openai_chat_stream_is_sse_ending_with_done(
    ollama_client: httpx.Client, ollama: OllamaState
) -> None:
    body = _chat(stream=True, stream_options={"include_usage": True})
    resp = ollama_client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "text/event-stream"
    data = sse_data(resp.text)
    assert data[-1] == "[DONE]"
    chunks = [orjson.loads(item) for item in data[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    *content, finish, usage = chunks
    assert "".join(c["choices"][0]["delta"]["content"] for c in content) == REPLY
    assert all(c["choices"][0]["finish_reason"] is None for c in content)
    assert finish["choices"][0]["finish_reason"] == "stop"
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 5

    ollama.stream_delay = 0.05
    _, lines = timed_lines(ollama_client, "/v1/chat/completions", _chat(stream=True))
    assert lines[-1][1] == "data: [DONE]"
    assert lines[-1][0] - lines[0][0] >= 0.2  # paced by stream_delay


def test_openai_errors(ollama_client: httpx.Client) -> None:
    wrong = ollama_client.post("/v1/chat/completions", json={"model": "nimble", "messages": []})
    assert wrong.status_code == 400
    assert wrong.json() == {
        "error": {
            "message": '"nimble" does not support chat',
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }
    }
    missing = ollama_client.post("/v1/chat/completions", json={"model": "x", "messages": []})
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "not_found_error"
    embed = ollama_client.post("/v1/embeddings", json={"model": "llama3.2", "input": "a"})
    assert embed.status_code == 400
    assert embed.json()["error"]["message"] == '"llama3.2" does not support embeddings'


def _norm(vector: list[float]) -> float:
    return math.sqrt(sum(v * v for v in vector))


def test_embed_is_deterministic_and_unit_length(
    ollama_client: httpx.Client, ollama: OllamaState
) -> None:
    ollama.models[EMBEDDER] = ["embedding"]
    one = ollama_client.post("/api/embed", json={"model": EMBEDDER, "input": "alpha"})
    assert one.status_code == 200
    data = one.json()
    assert data["model"] == EMBEDDER and data["prompt_eval_count"] == 1
    assert data["total_duration"] > 0
    (vector,) = data["embeddings"]
    assert len(vector) == EMBEDDING_DIM and _norm(vector) == pytest.approx(1.0)
    assert vector == embedding_vector("alpha")
    both = ollama_client.post("/api/embed", json={"model": EMBEDDER, "input": ["beta", "alpha"]})
    first, second = both.json()["embeddings"]
    assert second == vector and first != vector
    assert _norm(first) == pytest.approx(1.0)
    empty = ollama_client.post("/api/embed", json={"model": EMBEDDER}).json()
    assert empty["embeddings"] == []

    refused = ollama_client.post("/api/embed", json={"model": "nimble", "input": "a"})
    assert refused.status_code == 400
    assert refused.json() == {"error": '"nimble" does not support embeddings'}
    bad = ollama_client.post("/api/embed", json={"model": EMBEDDER, "input": 3})
    assert bad.status_code == 400


def test_openai_embeddings(ollama_client: httpx.Client, ollama: OllamaState) -> None:
    ollama.models[EMBEDDER] = ["embedding"]
    resp = ollama_client.post("/v1/embeddings", json={"model": EMBEDDER, "input": ["a", "b c"]})
    assert resp.status_code == 200
    data = resp.json()
    assert data["object"] == "list" and data["model"] == EMBEDDER
    assert [d["index"] for d in data["data"]] == [0, 1]
    assert all(d["object"] == "embedding" for d in data["data"])
    assert data["data"][1]["embedding"] == embedding_vector("b c")
    assert data["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    packed = ollama_client.post(
        "/v1/embeddings", json={"model": EMBEDDER, "input": "a", "encoding_format": "base64"}
    ).json()["data"][0]["embedding"]
    decoded = struct.unpack(f"<{EMBEDDING_DIM}f", base64.b64decode(packed))
    assert list(decoded) == pytest.approx(embedding_vector("a"), abs=1e-6)


def test_chat_requests_are_recorded_and_ndjson_helper(
    ollama_client: httpx.Client, ollama: OllamaState
) -> None:
    lines = ndjson(ollama_client.post("/api/chat", json=_chat()).text)
    assert lines[-1]["done"] is True
    (rec,) = ollama.requests
    assert (rec.method, rec.path, rec.json) == ("POST", "/api/chat", _chat())
