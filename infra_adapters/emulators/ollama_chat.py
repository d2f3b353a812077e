"""Ollama's chat and embeddings: `/api/chat`, `/api/embed` and the OpenAI-compatible
`/v1/chat/completions` and `/v1/embeddings`.

All four go through `faults.respond`. Chat streams are paced by
`OllamaState.stream_delay`; replies and vectors come from `generation`.
"""

from __future__ import annotations

import math
import random
import time
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
from .logprobs_chat import FILLERS, first_token_logprobs
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

# api/types.go ThinkValue.UnmarshalJSON: `think` is a bool or one of these strings; any other
# string, or another type, fails the request's decoding (a 400 with its message).
THINK_LEVELS = ("high", "medium", "low", "max")
_THINK_ERROR = '(must be "high", "medium", "low", "max", true, or false)'
# openai/openai.go thinkFromReasoningEffort: `/v1/chat/completions` takes no `think`; its
# `reasoning.effort` (first) or `reasoning_effort` becomes one ("none" is think: false).
REASONING_EFFORTS: dict[str, bool | str | None] = {
    "": None, "none": False, "minimal": "low", "low": "low", "medium": "medium", "high": "high",
    "max": "max", "xhigh": "max", "ultra": "max",
}
_EFFORT_ERROR = '(must be "minimal", "low", "medium", "high", "xhigh", "ultra", "max", or "none")'
# server/routes.go ChatHandler (both routes): a top_logprobs outside 0..20 is a 400, not clamped,
# checked right after decoding, before the model is looked up.
MAX_TOP_LOGPROBS = 20
TOP_LOGPROBS_ERROR = "top_logprobs must be between 0 and 20"
PIECE_PROB = 0.9  # /api/chat with logprobs: each generated piece's probability (FILLERS share the rest)


def _installed(state: OllamaState, model: Any) -> tuple[str, str]:
    """The requested name and the installed model's key, or a Problem worded as Ollama's."""
    if not isinstance(model, str) or not model:
        raise Problem("model is required")
    key = state.find_model(model)
    if key is None:
        raise Problem(f'model "{model}" not found, try pulling it first', 404)
    return model, key


def require_model(state: OllamaState, model: Any, capability: str, verb: str) -> tuple[str, str]:
    """`_installed`, and it has `capability` ("does not support <verb>" otherwise)."""
    model, key = _installed(state, model)
    if capability not in state.models.get(key, []):
        raise Problem(f'"{model}" does not support {verb}')
    return model, key


def _go_field(value: Any, struct: str, field: str, go_type_name: str) -> Problem:
    """encoding/json's UnmarshalTypeError for a field of the request (gin's ShouldBindJSON)."""
    shown = f"number {value!r}" if isinstance(value, float) and go_type_name == "int" else go_type(value)
    return Problem(f"json: cannot unmarshal {shown} into Go struct field {struct}.{field} of type {go_type_name}")


def _logprobs_options(payload: dict[str, Any], struct: str) -> tuple[bool, int]:
    """(`logprobs`, `top_logprobs`) as Ollama decodes them (a bool and an int; null is unset).
    `top_logprobs` does nothing without `logprobs: true` (llm/llama_server.go asks for
    probabilities only then)."""
    wanted = payload.get("logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise _go_field(wanted, struct, "logprobs", "bool")
    top_n = payload.get("top_logprobs")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int)):
        raise _go_field(top_n, struct, "top_logprobs", "int")
    return wanted is True, top_n or 0


def _check_top_logprobs(top_n: int) -> None:
    if not 0 <= top_n <= MAX_TOP_LOGPROBS:
        raise Problem(TOP_LOGPROBS_ERROR)


def _think(payload: dict[str, Any]) -> bool | str | None:
    """/api/chat's `think` (api/types.go ThinkValue): None when unset or null."""
    value = payload.get("think")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        if value in THINK_LEVELS:
            return value
        raise Problem(f'invalid think value: "{value}" {_THINK_ERROR}')
    raise Problem('think must be a boolean or string ("high", "medium", "low", "max", true, or false)')


def _reasoning_think(payload: dict[str, Any]) -> bool | str | None:
    """/v1/chat/completions' think, from `reasoning.effort` or else `reasoning_effort`
    (openai/openai.go FromChatRequest, thinkFromReasoningEffort)."""
    struct = "ChatCompletionRequest"
    effort = payload.get("reasoning_effort")
    if effort is not None and not isinstance(effort, str):
        raise _go_field(effort, struct, "reasoning_effort", "string")
    reasoning = payload.get("reasoning")
    if reasoning is not None:
        if not isinstance(reasoning, dict):
            raise _go_field(reasoning, struct, "reasoning", "openai.Reasoning")
        effort = reasoning.get("effort")
        if effort is not None and not isinstance(effort, str):
            raise _go_field(effort, struct, "reasoning.effort", "string")
    effort = effort or ""
    if effort not in REASONING_EFFORTS:
        raise Problem(f'invalid reasoning value: "{effort}" {_EFFORT_ERROR}')
    return REASONING_EFFORTS[effort]


def _check_chat_capabilities(state: OllamaState, key: str, model: str, payload: dict[str, Any],
                             think: bool | str | None) -> None:
    """server/routes.go ChatHandler: thinking asked of a model without it is a 400 (`think: false`,
    or `reasoning_effort: "none"`, is fine for any model); then the scheduler's checks."""
    capabilities = state.models.get(key, [])
    if think not in (None, False) and "thinking" not in capabilities:
        raise Problem(f'"{model}" does not support thinking')
    if "completion" not in capabilities:
        raise Problem(f'"{model}" does not support chat')
    if payload.get("tools") and "tools" not in capabilities:
        raise Problem(f'"{model}" does not support tools')


def _logprob(token: str, logprob: float, top: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One api.Logprob as Ollama writes it (api/types.go TokenLogprob and Logprob, filled by
    server/logprob.go toAPILogprobs): `bytes` are the token's UTF-8 bytes, left out for an empty
    token; `top_logprobs` is left out when empty (top_logprobs 0)."""
    entry: dict[str, Any] = {"token": token, "logprob": logprob}
    if token:
        entry["bytes"] = list(token.encode())
    if top:
        entry["top_logprobs"] = top
    return entry


def _piece_logprobs(piece: str, top_n: int) -> dict[str, Any]:
    chosen, rest = math.log(PIECE_PROB), math.log((1.0 - PIECE_PROB) / len(FILLERS))
    ranked = [(piece, chosen), *((f, rest) for f in FILLERS if f != piece)]
    return _logprob(piece, chosen, [_logprob(t, lp) for t, lp in ranked[:top_n]])


def openai_logprobs_body(state: OllamaState, model: str, messages: list[Any], top_n: int) -> dict[str, Any]:
    """Ollama's `chat.completion` with the first token's logprobs (label reading: one token, the
    labels' probabilities from `logprobs_chat.first_token_logprobs`), in openai/openai.go's shape
    (ToChatCompletion): no refusal, stop_reason or prompt_tokens_details, as vLLM has; `logprobs`
    is `{"content": [api.Logprob]}`."""
    ranked = sorted(first_token_logprobs(messages, state.label_mass).items(), key=lambda item: -item[1])
    token, logprob = ranked[0]
    top = [_logprob(t, lp) for t, lp in ranked[:top_n]]
    prompt = prompt_tokens(messages)
    return {
        "id": f"chatcmpl-{random.randrange(999)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": "fp_ollama",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": token},
            "finish_reason": "length",
            "logprobs": {"content": [_logprob(token, logprob, top)]},
        }],
        "usage": {"prompt_tokens": prompt, "completion_tokens": 1, "total_tokens": prompt + 1},
    }


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


def _with_logprobs(answer: dict[str, Any], entries: list[dict[str, Any]]) -> dict[str, Any]:
    if not entries:
        return answer  # omitempty
    out: dict[str, Any] = {}
    for name, value in answer.items():
        out[name] = value
        if name == "done":
            out["logprobs"] = entries
    return out


async def chat(request: web.Request, state: OllamaState) -> web.StreamResponse:
    """The `/api/chat` answer, streamed as NDJSON unless `"stream": false`."""
    try:
        payload = read_payload(await request.read())
        # Decoding first (api.ChatRequest), then ChatHandler's checks in its order.
        messages = _chat_messages(payload)
        problem = bad_keep_alive(payload.get("keep_alive"))
        if problem:
            raise Problem(problem)
        think = _think(payload)
        logprobs, top_n = _logprobs_options(payload, "ChatRequest")
        _check_top_logprobs(top_n)
        model, key = _installed(state, payload.get("model"))
        _check_chat_capabilities(state, key, model, payload, think)
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
    # With `logprobs`, every answer that carries tokens carries theirs in a top-level `logprobs`
    # list (api.ChatResponse.Logprobs, after `done`); the streamed answer's last line has none.
    entries = [_piece_logprobs(piece, top_n) for piece in pieces] if logprobs else []
    if payload.get("stream") is False:
        return json_response(_with_logprobs(_final(model, "".join(pieces), reason, prompt, len(pieces)),
                                            entries))
    events = [ndjson_line(_with_logprobs(_chunk(model, piece), entries[i:i + 1]))
              for i, piece in enumerate(pieces)]
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


async def openai_chat(request: web.Request, state: OllamaState) -> web.StreamResponse:
    """Ollama's `/v1/chat/completions` (SSE when `"stream": true`)."""
    try:
        payload = read_payload(await request.read())
        # middleware/openai.go ChatMiddleware decodes an openai.ChatCompletionRequest (no `think`,
        # no `keep_alive`: ignored here) and turns it into an api.ChatRequest for ChatHandler.
        chat_req = chat_request(payload)
        logprobs, top_n = _logprobs_options(payload, "ChatCompletionRequest")
        think = _reasoning_think(payload)
        _check_top_logprobs(top_n)
        model, key = _installed(state, chat_req.model)
        _check_chat_capabilities(state, key, model, payload, think)
        # First-token logprobs (label reading): Ollama takes `logprobs`/`top_logprobs` on its
        # OpenAI route and continues a final assistant message; it has no token-id extras.
        answer = (openai_logprobs_body(state, model, chat_req.messages, top_n)
                  if logprobs and not chat_req.stream else None)
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
