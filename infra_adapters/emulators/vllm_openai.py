"""vLLM's OpenAI-compatible `/v1/chat/completions` and `/v1/embeddings`.

A model's `task` option decides which it serves: "generate" models chat (SSE
when `"stream": true`, paced by `VllmState.stream_delay`), "embed" models give
embeddings; the other endpoint is a 400 worded as vLLM words it. Both go
through `faults.respond`; a chat with `logprobs` answers the first token's
logprobs (`logprobs_chat`, for label reading), with the prompt's tokens found in the prefix
cache when `VllmState.prefix_caching` is on; errors have vLLM's `{"error": {..., "code": status}}`.
"""

from __future__ import annotations

from aiohttp import web

from .answers import count_tokens
from .faults import faulty_route
from .generation import message_text, prompt_tokens
from .logprobs_chat import logprobs_body, tokenize, wants_logprobs
from .openai_compat import (
    Problem,
    chat_request,
    completion_reply,
    embeddings_body,
    embeddings_request,
    read_payload,
)
from .recording import json_response
from .vllm_state import JSON, STATE_KEY, VllmError, VllmState

UNSUPPORTED = {
    "generate": "The model does not support Chat Completions API",
    "embed": "The model does not support Embeddings API",
}


def resolve_model(state: VllmState, model: str | None, task: str) -> str:
    """The served model a request names (the first one when it names none)."""
    name = model if model is not None else next(iter(state.models), "")
    if name not in state.models:
        raise VllmError(f"The model `{name}` does not exist.", 404, "NotFoundError", param="model")
    if state.options(name)["task"] != task:
        raise VllmError(UNSUPPORTED[task])
    return name


def _too_long(limit: int, tokens: int, what: str) -> VllmError:
    return VllmError(
        f"This model's maximum context length is {limit} tokens. However, your request has "
        f"{tokens} input tokens. Please reduce the length of the {what}."
    )


async def chat(request: web.Request, state: VllmState) -> web.StreamResponse:
    try:
        payload = read_payload(await request.read())
        chat_req = chat_request(payload)
        model = resolve_model(state, chat_req.model, "generate")
        limit = int(state.options(model)["max_model_len"])
        tokens = prompt_tokens(chat_req.messages)
        if tokens + 1 > limit:
            raise _too_long(limit, tokens, "input messages")
        if wants_logprobs(payload) and not chat_req.stream:
            salt = payload.get("cache_salt")
            cached = (state.cached_tokens(salt if isinstance(salt, str) else None,
                                          "".join(message_text(m.get("content")) for m in chat_req.messages
                                                  if isinstance(m, dict)))
                      if state.prefix_caching else None)
            body = logprobs_body(model, payload, chat_req.messages, label_mass=state.label_mass,
                                 space_share=state.label_space_share, cached_tokens=cached)
            return json_response(body, content_type=JSON)
    except Problem as exc:
        return VllmError(exc.message, exc.status, param=exc.param).response()
    except VllmError as exc:
        return exc.response()
    return await completion_reply(
        request, "vllm", model, chat_req, delay=state.stream_delay, faults=state.faults
    )


async def embeddings(request: web.Request, state: VllmState) -> web.StreamResponse:
    try:
        emb_req = embeddings_request(read_payload(await request.read()))
        model = resolve_model(state, emb_req.model, "embed")
        limit = int(state.options(model)["max_model_len"])
        longest = max(count_tokens(text) for text in emb_req.texts)
        if longest > limit:
            raise _too_long(limit, longest, "input")
    except Problem as exc:
        return VllmError(exc.message, exc.status, param=exc.param).response()
    except VllmError as exc:
        return exc.response()
    return json_response(embeddings_body("vllm", model, emb_req), content_type=JSON)


async def tokenize_route(request: web.Request, state: VllmState) -> web.StreamResponse:
    """vLLM's `/tokenize` (`{"model", "prompt", "add_special_tokens"}` -> `{"tokens", ...}`)."""
    try:
        payload = read_payload(await request.read())
        prompt = payload.get("prompt")
        if not isinstance(prompt, str):
            raise Problem("prompt must be a string", param="prompt")
        model = payload.get("model") if payload.get("model") is not None else next(iter(state.models), "")
        if model not in state.models:
            raise VllmError(f"The model `{model}` does not exist.", 404, "NotFoundError", param="model")
    except Problem as exc:
        return VllmError(exc.message, exc.status, param=exc.param).response()
    except VllmError as exc:
        return exc.response()
    tokens = tokenize(prompt)
    return json_response({"count": len(tokens), "max_model_len": int(state.options(model)["max_model_len"]),
                          "tokens": tokens, "token_strs": None}, content_type=JSON)


def add_openai_routes(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions", faulty_route(STATE_KEY, chat))
    app.router.add_post("/tokenize", faulty_route(STATE_KEY, tokenize_route))
    app.router.add_post("/v1/embeddings", faulty_route(STATE_KEY, embeddings))
