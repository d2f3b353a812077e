"""Ollama's chat and embeddings: `/api/chat`, `/api/embed` and the OpenAI-compatible
`/v1/chat/completions` and `/v1/embeddings`.

All four go through `faults.respond`. Chat streams are paced by
`OllamaState.stream_delay`; replies and vectors come from `generation`.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from .answers import count_tokens
from .faults import faulty_route
from .generation import (
    created_at,
    embedding_inputs,
    embedding_vector,
    fake_durations,
    prompt_tokens,
    reply_pieces,
)
from .logprobs_chat import logprobs_body, wants_logprobs
from .ollama_state import STATE_KEY, OllamaState, error
from .ollama_validation import bad_keep_alive, go_type
from .openai_compat import (
    Problem,
    chat_request,
    completion_reply,
    embeddings_body,
    embeddings_request,
    ollama_openai_error,
    read_payload,
)
from .recording import json_response
from .streaming import NDJSON, ndjson_line, stream_events

THINK_VALUES = (True, "high", "medium", "low")


def require_model(state: OllamaState, model: Any, capability: str, verb: str) -> tuple[str, str]:
    """The requested name and the installed model's key, or a Problem worded as Ollama's."""
    if not isinstance(model, str) or not model:
        raise Problem("model is required")
    key = state.find_model(model)
    if key is None:
        raise Problem(f'model "{model}" not found, try pulling it first', 404)
    if capability not in state.models.get(key, []):
        raise Problem(f'"{model}" does not support {verb}')
    return model, key


def _check_chat_extras(state: OllamaState, key: str, model: str, payload: dict[str, Any]) -> None:
    capabilities = state.models.get(key, [])
    if payload.get("tools") and "tools" not in capabilities:
        raise Problem(f'"{model}" does not support tools')
    if payload.get("think") in THINK_VALUES and "thinking" not in capabilities:
        raise Problem(f'"{model}" does not support thinking')
    problem = bad_keep_alive(payload.get("keep_alive"))
    if problem:
        raise Problem(problem)


def _chat_messages(payload: dict[str, Any]) -> list[Any]:
    messages = payload.get("messages")
    if messages is None:
        return []
    where = "Go struct field ChatRequest.messages of type"
    if not isinstance(messages, list):
        raise Problem(f"json: cannot unmarshal {go_type(messages)} into {where} []api.Message")
    for message in messages:
        if not isinstance(message, dict):
            raise Problem(f"json: cannot unmarshal {go_type(message)} into {where} api.Message")
    return messages


def _num_predict(payload: dict[str, Any]) -> int | None:
    options = payload.get("options")
    value = options.get("num_predict") if isinstance(options, dict) else None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None  # absent or negative: no limit


def _chunk(model: str, content: str) -> dict[str, Any]:
    return {
        "model": model,
        "created_at": created_at(),
        "message": {"role": "assistant", "content": content},
        "done": False,
    }


def _final(model: str, content: str, reason: str, prompt: int, generated: int) -> dict[str, Any]:
    durations = fake_durations(prompt, generated)
    return {
        "model": model,
        "created_at": created_at(),
        "message": {"role": "assistant", "content": content},
        "done_reason": reason,
        "done": True,
        "total_duration": durations["total_duration"],
        "load_duration": durations["load_duration"],
        "prompt_eval_count": prompt,
        "prompt_eval_duration": durations["prompt_eval_duration"],
        "eval_count": generated,
        "eval_duration": durations["eval_duration"],
    }


async def chat(request: web.Request, state: OllamaState) -> web.StreamResponse:
    """The `/api/chat` answer, streamed as NDJSON unless `"stream": false`."""
    try:
        payload = read_payload(await request.read())
        model, key = require_model(state, payload.get("model"), "completion", "chat")
        _check_chat_extras(state, key, model, payload)
        messages = _chat_messages(payload)
    except Problem as exc:
        return error(exc.status, exc.message)
    if not messages:  # Ollama loads the model and says so
        return json_response(
            {
                "model": model,
                "created_at": created_at(),
                "message": {"role": "assistant", "content": ""},
                "done_reason": "load",
                "done": True,
            }
        )
    pieces, cut = reply_pieces(messages, _num_predict(payload))
    reason = "length" if cut else "stop"
    prompt = prompt_tokens(messages)
    if payload.get("stream") is False:
        return json_response(_final(model, "".join(pieces), reason, prompt, len(pieces)))
    events = [ndjson_line(_chunk(model, piece)) for piece in pieces]
    events.append(ndjson_line(_final(model, "", reason, prompt, len(pieces))))
    return await stream_events(
        request, events, content_type=NDJSON, delay=state.stream_delay, faults=state.faults
    )


async def embed(request: web.Request, state: OllamaState) -> web.StreamResponse:
    """The `/api/embed` answer."""
    try:
        payload = read_payload(await request.read())
        model, _ = require_model(state, payload.get("model"), "embedding", "embeddings")
        raw = payload.get("input")
        texts = [] if raw is None else embedding_inputs(raw)
        if texts is None:
            raise Problem("invalid input type")
    except Problem as exc:
        return error(exc.status, exc.message)
    tokens = sum(count_tokens(text) for text in texts)
    durations = fake_durations(tokens, 0)
    return json_response(
        {
            "model": model,
            "embeddings": [embedding_vector(text) for text in texts],
            "total_duration": durations["total_duration"],
            "load_duration": durations["load_duration"],
            "prompt_eval_count": tokens,
        }
    )


_VLLM_ONLY = ("logprob_token_ids", "allowed_token_ids")


async def openai_chat(request: web.Request, state: OllamaState) -> web.StreamResponse:
    """Ollama's `/v1/chat/completions` (SSE when `"stream": true`)."""
    try:
        payload = read_payload(await request.read())
        chat_req = chat_request(payload)
        model, key = require_model(state, chat_req.model, "completion", "chat")
        _check_chat_extras(state, key, model, payload)
        # First-token logprobs (label reading): Ollama takes `logprobs`/`top_logprobs` on its
        # OpenAI route and continues a final assistant message; it has no token-id extras.
        answer = (logprobs_body(model, {k: v for k, v in payload.items() if k not in _VLLM_ONLY},
                                chat_req.messages, label_mass=state.label_mass)
                  if wants_logprobs(payload) and not chat_req.stream else None)
    except Problem as exc:
        return ollama_openai_error(exc.message, exc.status)
    if answer is not None:
        return json_response(answer)
    return await completion_reply(
        request, "ollama", model, chat_req, delay=state.stream_delay, faults=state.faults
    )


async def openai_embeddings(request: web.Request, state: OllamaState) -> web.StreamResponse:
    """Ollama's `/v1/embeddings`."""
    try:
        emb_req = embeddings_request(read_payload(await request.read()))
        model, _ = require_model(state, emb_req.model, "embedding", "embeddings")
    except Problem as exc:
        return ollama_openai_error(exc.message, exc.status)
    return json_response(embeddings_body("ollama", model, emb_req))


def add_chat_routes(app: web.Application) -> None:
    app.router.add_post("/api/chat", faulty_route(STATE_KEY, chat))
    app.router.add_post("/api/embed", faulty_route(STATE_KEY, embed))
    app.router.add_post("/v1/chat/completions", faulty_route(STATE_KEY, openai_chat))
    app.router.add_post("/v1/embeddings", faulty_route(STATE_KEY, openai_embeddings))
