"""OpenAI-shaped chat completions and embeddings, as Ollama and vLLM write them.

Both backends speak `/v1/chat/completions` and `/v1/embeddings`; they differ in
small ways that clients notice: ids, `system_fingerprint`, extra fields, the
first streamed chunk (vLLM sends the role alone), the JSON and SSE Content-Types
and the error shape. `flavor` is "ollama" or "vllm".
"""

from __future__ import annotations

import random
import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from aiohttp import web

from .answers import count_tokens
from .faults import Faults
from .generation import (
    embedding_base64,
    embedding_inputs,
    embedding_vector,
    prompt_tokens,
    reply_pieces,
)
from .recording import is_missing, json_response, parse_json
from .streaming import SSE_DONE, sse_event, stream_events

Flavor = Literal["ollama", "vllm"]
SSE_CONTENT_TYPE: dict[Flavor, str] = {
    "ollama": "text/event-stream",
    "vllm": "text/event-stream; charset=utf-8",
}
JSON_CONTENT_TYPE: dict[Flavor, str] = {
    "ollama": "application/json; charset=utf-8",
    "vllm": "application/json",
}
ENCODING_FORMATS = ("float", "base64")


class Problem(Exception):
    """A request the backend refuses; each emulator words and shapes it its own way."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.param = message, status, param


def ollama_openai_error(message: str, status: int = 400) -> Any:
    """Ollama's OpenAI-compatible error: type from the status, `param` and `code` null."""
    err_type = {400: "invalid_request_error", 404: "not_found_error"}.get(status, "api_error")
    body = {"error": {"message": message, "type": err_type, "param": None, "code": None}}
    return json_response(body, status=status, content_type="application/json; charset=utf-8")


def read_payload(body: bytes) -> dict[str, Any]:
    payload = parse_json(body)
    if is_missing(payload):
        raise Problem("missing request body" if not body.strip() else "invalid JSON body")
    if not isinstance(payload, dict):
        raise Problem("request body must be a JSON object")
    return payload


@dataclass
class ChatRequest:
    model: str | None
    messages: list[Any]
    stream: bool
    include_usage: bool
    max_tokens: int | None


def chat_request(payload: dict[str, Any]) -> ChatRequest:
    """The parts of an OpenAI chat request the emulators use, checked."""
    model = payload.get("model")
    if model is not None and not isinstance(model, str):
        raise Problem("model must be a string", param="model")
    messages = payload.get("messages")
    if not isinstance(messages, list):
        raise Problem("messages is required" if messages is None else "messages must be an array")
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise Problem("each message must be an object with a role", param="messages")
    limit = payload.get("max_completion_tokens", payload.get("max_tokens"))
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise Problem("max_tokens must be a positive integer", param="max_tokens")
    options = payload.get("stream_options")
    return ChatRequest(
        model=model,
        messages=messages,
        stream=payload.get("stream") is True,
        include_usage=isinstance(options, dict) and options.get("include_usage") is True,
        max_tokens=limit,
    )


def _completion_id(flavor: Flavor) -> str:
    if flavor == "ollama":
        return f"chatcmpl-{random.randint(0, 999)}"
    return f"chatcmpl-{uuid.uuid4().hex}"


def _usage(flavor: Flavor, prompt: int, completion: int) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if flavor == "vllm":
        usage["prompt_tokens_details"] = None
    return usage


def _envelope(flavor: Flavor, object_name: str, cid: str, model: str) -> dict[str, Any]:
    return {
        "id": cid,
        "object": object_name,
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": "fp_ollama" if flavor == "ollama" else None,
    }


def completion_body(flavor: Flavor, model: str, chat: ChatRequest) -> dict[str, Any]:
    """The non-streamed `chat.completion` answer."""
    pieces, cut = reply_pieces(chat.messages, chat.max_tokens)
    message: dict[str, Any] = {"role": "assistant", "content": "".join(pieces)}
    choice: dict[str, Any] = {
        "index": 0,
        "message": message,
        "finish_reason": "length" if cut else "stop",
    }
    if flavor == "vllm":
        message.update(refusal=None, tool_calls=[], reasoning_content=None)
        choice.update(logprobs=None, stop_reason=None)
    body = _envelope(flavor, "chat.completion", _completion_id(flavor), model)
    body["choices"] = [choice]
    body["usage"] = _usage(flavor, prompt_tokens(chat.messages), len(pieces))
    return body


def completion_events(flavor: Flavor, model: str, chat: ChatRequest) -> list[bytes]:
    """The streamed answer: `chat.completion.chunk` SSE events, then `data: [DONE]`."""
    pieces, cut = reply_pieces(chat.messages, chat.max_tokens)
    finish = "length" if cut else "stop"
    cid = _completion_id(flavor)

    def chunk(delta: dict[str, Any], finish_reason: str | None) -> bytes:
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish_reason}
        if flavor == "vllm":
            choice.update(logprobs=None)
            if finish_reason is not None:
                choice["stop_reason"] = None
        body = _envelope(flavor, "chat.completion.chunk", cid, model)
        body["choices"] = [choice]
        return sse_event(body)

    events: list[bytes] = []
    if flavor == "ollama":
        events += [chunk({"role": "assistant", "content": piece}, None) for piece in pieces]
        events.append(chunk({"role": "assistant", "content": ""}, finish))
    else:
        events.append(chunk({"role": "assistant", "content": ""}, None))
        for i, piece in enumerate(pieces):
            events.append(chunk({"content": piece}, finish if i == len(pieces) - 1 else None))
        if not pieces:
            events.append(chunk({"content": ""}, finish))
    if chat.include_usage:
        body = _envelope(flavor, "chat.completion.chunk", cid, model)
        body["choices"] = []
        body["usage"] = _usage(flavor, prompt_tokens(chat.messages), len(pieces))
        events.append(sse_event(body))
    events.append(SSE_DONE)
    return events


async def completion_reply(
    request: web.Request,
    flavor: Flavor,
    model: str,
    chat: ChatRequest,
    *,
    delay: float,
    faults: Faults | None,
) -> web.StreamResponse:
    """The answer to a checked chat request: one `chat.completion` body, or SSE events
    `delay` seconds apart when it asked for a stream."""
    if not chat.stream:
        return json_response(
            completion_body(flavor, model, chat), content_type=JSON_CONTENT_TYPE[flavor]
        )
    return await stream_events(
        request,
        completion_events(flavor, model, chat),
        content_type=SSE_CONTENT_TYPE[flavor],
        delay=delay,
        faults=faults,
    )


@dataclass
class EmbeddingsRequest:
    model: str | None
    texts: list[str]
    encoding_format: str


def embeddings_request(payload: dict[str, Any]) -> EmbeddingsRequest:
    model = payload.get("model")
    if model is not None and not isinstance(model, str):
        raise Problem("model must be a string", param="model")
    if "input" not in payload:
        raise Problem("input is required", param="input")
    texts = embedding_inputs(payload["input"])
    if texts is None or not texts:
        raise Problem("invalid input: expected a string or an array of strings", param="input")
    encoding = payload.get("encoding_format") or "float"
    if encoding not in ENCODING_FORMATS:
        raise Problem(
            f"invalid encoding_format {encoding!r}: expected 'float' or 'base64'",
            param="encoding_format",
        )
    return EmbeddingsRequest(model=model, texts=texts, encoding_format=encoding)


def embeddings_body(flavor: Flavor, model: str, request: EmbeddingsRequest) -> dict[str, Any]:
    data: list[dict[str, Any]] = []
    for index, text in enumerate(request.texts):
        vector = embedding_vector(text)
        encoded = embedding_base64(vector) if request.encoding_format == "base64" else vector
        data.append({"object": "embedding", "index": index, "embedding": encoded})
    tokens = sum(count_tokens(text) for text in request.texts)
    usage: dict[str, Any] = {"prompt_tokens": tokens, "total_tokens": tokens}
    if flavor == "ollama":
        return {"object": "list", "data": data, "model": model, "usage": usage}
    usage.update(completion_tokens=0, prompt_tokens_details=None)
    return {
        "id": f"embd-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": data,
        "usage": usage,
    }
