"""vLLM's OpenAI-compatible `/v1/chat/completions` and `/v1/embeddings`, and `/tokenize`.

A model's `task` option decides which it serves: "generate" models chat (SSE when
`"stream": true`, paced by `VllmState.stream_delay`), "embed" models give embeddings; the other
endpoint is a 501, as vLLM's router answers a model without that handler. Both go through
`faults.respond`. A chat request is checked as vLLM 0.33 checks a `ChatCompletionRequest`
(chat_completion/protocol.py: unknown fields are allowed; its `mode="before"` validators, then
the fields this emulator reads), then as the renderer and the engine check it; `logprobs: true`
answers the first token's logprobs (`logprobs_chat`, for label reading), with the prompt's tokens
found in the prefix cache when `VllmState.prefix_caching` is on. Errors have vLLM's
`{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from .answers import count_tokens
from .faults import faulty_route
from .generation import message_text, prompt_tokens
from .logprobs_chat import chat_completion, check_sampling, logprobs_body, tokenize
from .openai_compat import (
    Problem,
    chat_request,
    completion_body,
    completion_reply,
    embeddings_body,
    embeddings_request,
    read_payload,
)
from .recording import json_response
from .vllm_state import JSON, STATE_KEY, VllmError, VllmState
from .vllm_validation import (
    AnyS,
    DictS,
    FloatS,
    IntS,
    LaxBoolS,
    ListS,
    ModelS,
    NullableS,
    ParamError,
    RequestInvalid,
    StrS,
    check_cache_salt,
    lax_bool,
    parse_body,
    validate,
)

UNSUPPORTED = {  # chat_completion/api_router.py, pooling/embed/api_router.py: no handler
    "generate": "The model does not support Chat Completions API",
    "embed": "The model does not support Embeddings API",
}
INT64 = 2**63
_BOOL = NullableS(LaxBoolS())
_INT = NullableS(IntS())
_FLOAT = NullableS(FloatS())
_IDS = NullableS(ListS(IntS()))
# The ChatCompletionRequest fields the emulator reads, in the model's order (a message's own
# shape is left to `openai_compat.chat_request`).
CHAT_REQUEST = ModelS("ChatCompletionRequest", [
    ("messages", ListS(AnyS()), True),
    ("model", NullableS(StrS()), False),
    ("logprobs", _BOOL, False),
    ("top_logprobs", _INT, False),
    ("max_tokens", _INT, False),
    ("max_completion_tokens", _INT, False),
    ("n", _INT, False),
    ("stream", _BOOL, False),
    ("temperature", _FLOAT, False),
    ("top_p", _FLOAT, False),
    ("use_beam_search", LaxBoolS(), False),
    ("top_k", _INT, False),
    ("logprob_token_ids", _IDS, False),
    ("allowed_token_ids", _IDS, False),
    ("add_generation_prompt", LaxBoolS(), False),
    ("continue_final_message", LaxBoolS(), False),
    ("chat_template_kwargs", NullableS(DictS(AnyS())), False),
    ("priority", IntS(ge=-INT64, le=INT64 - 1), False),
    ("cache_salt", NullableS(StrS(min_length=1, max_length=1024)), False),
    ("return_tokens_as_token_ids", _BOOL, False),
], forbid_extra=False)


def resolve_model(state: VllmState, model: str | None, task: str) -> str:
    """The served model a request names (the first one when it names none)."""
    name = model if model is not None else next(iter(state.models), "")
    if name not in state.models:
        raise state.unknown_model(name)
    if state.options(name)["task"] != task:
        raise VllmError(UNSUPPORTED[task], 501, "NotImplementedError")
    return name


def _too_long(limit: int, tokens: int, what: str) -> VllmError:  # embeddings
    return VllmError(
        f"This model's maximum context length is {limit} tokens. However, your request has "
        f"{tokens} input tokens. Please reduce the length of the {what}."
    )


def check_chat_before(payload: dict[str, Any]) -> None:
    """ChatCompletionRequest's `mode="before"` validators (chat_completion/protocol.py), in the
    order pydantic runs them (the last defined first); each raises a VLLMValidationError."""
    if payload.get("continue_final_message") and payload.get("add_generation_prompt"):  # check_generation_prompt
        raise ParamError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    if payload.get("tools") == []:  # check_tool_usage
        raise ParamError("`tools` must not be an empty array. Either provide at least one tool or omit the "
                         "field entirely.", parameter="tools")
    # check_logprobs
    if payload.get("logprob_token_ids") and payload.get("use_beam_search"):
        raise ParamError("`logprob_token_ids` is not supported with beam search.", parameter="logprob_token_ids")
    if payload.get("logprob_token_ids") and not payload.get("logprobs"):
        raise ParamError("when using `logprob_token_ids`, `logprobs` must be set to true.",
                         parameter="logprob_token_ids")
    for name in ("prompt_logprobs", "top_logprobs"):
        value = payload.get(name)
        if value is not None and not isinstance(value, int | float):
            raise ParamError(f"`{name}` must be an integer.", parameter=name, value=value)
    top = payload.get("top_logprobs")
    if top is not None:
        if top < 0 and top != -1:
            raise ParamError("`top_logprobs` must be a positive value or -1.", parameter="top_logprobs", value=top)
        if (top == -1 or top > 0) and not payload.get("logprobs"):
            raise ParamError("when using `top_logprobs`, `logprobs` must be set to true.", parameter="top_logprobs")
    if payload.get("stream_options") and not payload.get("stream"):  # validate_stream_options
        raise ParamError("Stream options can only be defined when `stream=True`.", parameter="stream_options")
    check_cache_salt(payload)  # check_cache_salt_support


def check_render(payload: dict[str, Any], limit: int, tokens: int) -> None:
    """What rendering refuses: the output budget (renderers/params.py TokenizeParams), the chat
    template's own check (transformers, surfaced by renderers/hf.py as a VLLMValidationError),
    the prompt's length (TokenizeParams._token_len_check: the tokenizer stops at limit + 1), and a
    prompt that leaves no room for a token (`get_max_tokens` is then 0, which SamplingParams refuses)."""
    cap_name = "max_completion_tokens" if payload.get("max_completion_tokens") is not None else "max_tokens"
    cap = payload.get(cap_name)
    cap = None if cap is None else int(float(cap))
    if cap is not None and cap > limit:
        raise ParamError(f"{cap_name}={cap} cannot be greater than max_model_len={limit}. Please request fewer "
                         "output tokens.", parameter=cap_name, value=cap)
    if lax_bool(payload.get("continue_final_message", False)) and lax_bool(payload.get("add_generation_prompt", True)):
        raise ParamError("continue_final_message and add_generation_prompt are not compatible. Use "
                         "continue_final_message when you want the model to continue the final message, and "
                         "add_generation_prompt when you want to add a header that will prompt it to start a new "
                         "assistant message instead.")
    if tokens > limit:
        counted = limit + 1
        raise ParamError(f"This model's maximum context length is {limit} tokens. However, your prompt contains "
                         f"at least {counted} input tokens, which exceeds this limit even without any output "
                         "tokens. Please reduce the length of the input prompt.", parameter="input_tokens",
                         value=counted)
    budget = min(v for v in (limit - tokens, cap) if v is not None)
    if budget < 1:  # SamplingParams._verify_args
        raise ParamError(f"max_tokens must be at least 1, got {budget}.", parameter="max_tokens", value=budget)


def _plain_body(model: str, chat_req: Any) -> dict[str, Any]:
    """openai_compat's reply in vLLM's full `ChatCompletionResponse` dump."""
    body = completion_body("vllm", model, chat_req)
    (choice,) = body["choices"]
    usage = body["usage"]
    return chat_completion(model, choice["message"]["content"], None, choice["finish_reason"], {
        "prompt_tokens": usage["prompt_tokens"], "total_tokens": usage["total_tokens"],
        "completion_tokens": usage["completion_tokens"], "prompt_tokens_details": None,
        "completion_tokens_details": None})


async def chat(request: web.Request, state: VllmState) -> web.StreamResponse:
    try:
        payload = parse_body(await request.read())
        if isinstance(payload, dict):
            check_chat_before(payload)
        validate(CHAT_REQUEST, payload)
        model = resolve_model(state, payload.get("model"), "generate")
        # openai_compat reads the messages; the token budget and stream are read as pydantic reads them.
        chat_req = chat_request({**payload, "max_tokens": None, "max_completion_tokens": None})
        limit = int(state.options(model)["max_model_len"])
        check_render(payload, limit, prompt_tokens(chat_req.messages))
        cap = payload.get("max_completion_tokens", payload.get("max_tokens"))
        chat_req.max_tokens = None if cap is None else int(float(cap))
        chat_req.stream = bool(lax_bool(payload.get("stream")))
        logprobs = bool(lax_bool(payload.get("logprobs")))
        top_logprobs = int(payload.get("top_logprobs") or 0)
        check_sampling(payload, logprobs, top_logprobs)
        if logprobs and not chat_req.stream:
            salt = payload.get("cache_salt")
            cached = (state.cached_tokens(salt if isinstance(salt, str) else None,
                                          "".join(message_text(m.get("content")) for m in chat_req.messages
                                                  if isinstance(m, dict)))
                      if state.prefix_caching else None)
            as_ids = lax_bool(payload.get("return_tokens_as_token_ids"))
            temperature = payload.get("temperature")
            body = logprobs_body(model, payload, chat_req.messages, label_mass=state.label_mass,
                                 space_share=state.label_space_share, cached_tokens=cached,
                                 return_tokens_as_token_ids=state.return_tokens_as_token_ids if as_ids is None
                                 else as_ids, logprobs_mode=state.logprobs_mode, top_logprobs=top_logprobs,
                                 temperature=None if temperature is None else float(temperature))
            return json_response(body, content_type=JSON)
    except Problem as exc:
        return VllmError(exc.message, exc.status, param=exc.param).response()
    except (RequestInvalid, ParamError, VllmError) as exc:
        return exc.response()
    if not chat_req.stream:
        return json_response(_plain_body(model, chat_req), content_type=JSON)
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
            raise state.unknown_model(model)
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
