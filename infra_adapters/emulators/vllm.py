"""A vLLM emulator: `/version`, `/health`, `/v1/models`, `/v1/systemone`,
`/v1/chat/completions` and `/v1/embeddings` (`vllm_openai`), and OpenAI's
`/v1/decisions` (`vllm_decisions`).

A model's `task` option says what it serves: "generate" (chat and decisions)
or "embed" (embeddings only; decisions are a 501 as for a model without a
read strategy, chat a 400).

Errors follow vLLM's OpenAI-style shape
`{"error": {"message", "type", "param", "code"}}`; routes it does not have
answer as FastAPI does (`{"detail": "Not Found"}`); `--api-key` guards the
`/v1` routes only, with vLLM's own `{"error": "Unauthorized"}` 401.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from aiohttp import web

from .answers import QUESTION_TYPES, count_tokens, question_tokens, text_of, usage, vllm_answer
from .faults import respond
from .recording import (
    CLIENT_MAX_SIZE,
    bearer_token,
    is_missing,
    json_response,
    parse_json,
    recording_middleware,
)
from .server import serve_forever
from .vllm_decisions import add_decisions_route
from .vllm_openai import add_openai_routes
from .vllm_state import (
    JSON,
    STATE_KEY,
    VllmError,
    VllmState,
    default_model_options,
    default_vllm_models,
    error_response,
)

__all__ = [
    "VllmError",
    "VllmState",
    "default_model_options",
    "default_vllm_models",
    "error_response",
    "make_vllm_app",
    "run_vllm_emulator",
]

MAX_QUESTIONS = 64
SCORE_LEVELS = (2, 10)
QUESTION_FIELDS = frozenset({"type", "instructions", "criteria"})
MEDIA_KEYS = ("images", "audio", "videos")
GUARDED_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else "value"


def _field_error(loc: str, msg: str) -> VllmError:
    return VllmError(f"1 validation error for SystemOneRequest\n{loc}\n  {msg}")


# -- request validation (what vLLM's pydantic model and handler check) --------


def _check_question(qid: str, q: Any, opts: dict[str, Any]) -> None:
    loc = f"questions.{qid}"
    if not qid:
        raise _field_error("questions", "Question ids must be non-empty strings")
    if not isinstance(q, dict):
        raise _field_error(loc, f"Input should be a valid dictionary, got {_kind(q)}")
    extra = [k for k in q if k not in QUESTION_FIELDS]
    if extra:
        raise _field_error(f"{loc}.{extra[0]}", "Extra inputs are not permitted")
    qtype = q.get("type")
    if qtype not in QUESTION_TYPES:
        raise _field_error(
            f"{loc}.type",
            "Input should be 'choice', 'noul' or 'score'" if "type" in q else "Field required",
        )
    instructions = q.get("instructions")
    if isinstance(instructions, bool | int | float):
        raise _field_error(f"{loc}.instructions", "Input should be a string, object or array")
    if instructions is not None and not opts["instructions"]:
        raise VllmError(f"Question '{qid}': this model does not accept instructions.")
    criteria = q.get("criteria")
    if qtype == "choice":
        if not isinstance(criteria, dict):
            raise _field_error(f"{loc}.criteria", "Input should be a valid dictionary")
        if any(v is not None and not isinstance(v, str) for v in criteria.values()):
            raise _field_error(f"{loc}.criteria", "Option descriptions must be strings or null")
        hi = int(opts["max_options"])
        if not 1 <= len(criteria) <= hi:
            raise VllmError(
                f"Question '{qid}': a choice takes 1 to {hi} options, got {len(criteria)}."
            )
    elif qtype == "noul":
        if criteria is not None:
            if not isinstance(criteria, dict):
                raise _field_error(f"{loc}.criteria", "Input should be a valid dictionary")
            for key, value in criteria.items():
                if key not in ("true", "false"):
                    raise _field_error(f"{loc}.criteria.{key}", "Extra inputs are not permitted")
                if value is not None and not isinstance(value, str):
                    raise _field_error(f"{loc}.criteria.{key}", "Input should be a valid string")
    else:
        if not isinstance(criteria, list) or any(not isinstance(x, str) for x in criteria):
            raise _field_error(f"{loc}.criteria", "Input should be a valid list of strings")
        lo, hi = SCORE_LEVELS
        if not lo <= len(criteria) <= hi:
            raise VllmError(
                f"Question '{qid}': a score takes {lo} to {hi} levels, got {len(criteria)}."
            )


def _check_body(payload: Any) -> None:
    """Schema checks that do not depend on the model (pydantic's part)."""
    if not isinstance(payload, dict):
        raise _field_error("body", f"Input should be a valid dictionary, got {_kind(payload)}")
    if (
        "model" in payload
        and payload["model"] is not None
        and not isinstance(payload["model"], str)
    ):
        raise _field_error("model", "Input should be a valid string")
    if "state" not in payload:
        raise _field_error("state", "Field required")
    if isinstance(payload["state"], bool | int | float):
        raise _field_error("state", "Input should be a valid string, dictionary or list")
    questions = payload.get("questions")
    if "questions" not in payload:
        raise _field_error("questions", "Field required")
    if not isinstance(questions, dict):
        raise _field_error("questions", "Input should be a valid dictionary")
    salt = payload.get("cache_salt")
    if "cache_salt" in payload and (not isinstance(salt, str) or not salt):
        raise VllmError(
            "Parameter 'cache_salt' must be a non-empty string if provided.", param="cache_salt"
        )
    kwargs = payload.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise _field_error("chat_template_kwargs", "Input should be a valid dictionary")
    for key in MEDIA_KEYS:
        media = payload.get(key)
        if media is not None and (
            not isinstance(media, list) or any(not isinstance(x, str) for x in media)
        ):
            raise _field_error(key, "Input should be a valid list of strings")


def _check_for_model(model: str, payload: dict[str, Any], opts: dict[str, Any]) -> None:
    questions: dict[str, Any] = payload["questions"]
    if not 1 <= len(questions) <= MAX_QUESTIONS:
        raise VllmError(
            f"A request takes 1 to {MAX_QUESTIONS} questions, got {len(questions)}.",
            param="questions",
        )
    for qid, q in questions.items():
        _check_question(qid, q, opts)
    for key in MEDIA_KEYS:
        media = payload.get(key) or []
        if media and key not in opts["media"]:
            raise VllmError(f"Model `{model}` does not accept {key}.", param=key)
        for item in media:
            if not item.startswith(("data:", "http://", "https://")):
                raise VllmError(
                    f"Invalid {key} URL: expected a data: or http(s):// URL.", param=key
                )
    state_tokens = count_tokens(text_of(payload["state"]))
    preamble_tokens = count_tokens(text_of(payload.get("instructions")))
    limit = int(opts["max_model_len"])
    for q in questions.values():
        needed = question_tokens(state_tokens, q, preamble_tokens)
        if needed + 1 > limit:
            raise VllmError(
                f"This model's maximum context length is {limit} tokens. However, your request "
                f"has {needed} input tokens. Please reduce the length of the input messages."
            )


def decide(state: VllmState, body: bytes) -> web.Response:
    """The `/v1/systemone` answer for `body`, validated as vLLM does."""
    payload = parse_json(body)
    try:
        if is_missing(payload):
            raise VllmError("JSON decode error" if body.strip() else "Field required: body")
        _check_body(payload)
        model = payload.get("model")
        if model is None:
            model = next(iter(state.models), "")
        if model not in state.models:
            raise VllmError(
                f"The model `{model}` does not exist.", 404, "NotFoundError", param="model"
            )
        opts = state.options(model)
        if not opts["read_strategy"] or opts["task"] == "embed":
            raise VllmError(
                f"Model `{model}` has no read strategy for structured decisions.",
                501,
                "NotImplementedError",
            )
        _check_for_model(model, payload, opts)
    except VllmError as exc:
        return exc.response()
    answers: dict[str, Any] = {}
    diagnostics: dict[str, Any] = {}
    for qid, q in payload["questions"].items():
        answers[qid], diagnostics[qid] = vllm_answer(payload["state"], q)
    body_out = {
        "id": f"decision-{uuid.uuid4().hex}",
        "object": "structured_decision",
        "created": int(time.time()),
        "model": model,
        "answers": answers,
        "usage": usage(payload["state"], payload["questions"], payload.get("instructions")),
        "diagnostics": diagnostics,
    }
    return json_response(body_out, content_type=JSON)


# -- handlers ----------------------------------------------------------------


async def handle_version(request: web.Request) -> web.Response:
    return json_response({"version": request.app[STATE_KEY].version}, content_type=JSON)


async def handle_health(request: web.Request) -> web.Response:
    return web.Response(status=200)


def model_card(state: VllmState, model_id: str) -> dict[str, Any]:
    opts = state.options(model_id)
    return {
        "id": model_id,
        "object": "model",
        "created": state.created,
        "owned_by": "vllm",
        "root": opts["root"] or model_id,
        "parent": None,
        "max_model_len": int(opts["max_model_len"]),
        "permission": [
            {
                "id": f"modelperm-{uuid.uuid5(uuid.NAMESPACE_URL, model_id).hex}",
                "object": "model_permission",
                "created": state.created,
                "allow_create_engine": False,
                "allow_sampling": True,
                "allow_logprobs": True,
                "allow_search_indices": False,
                "allow_view": True,
                "allow_fine_tuning": False,
                "organization": "*",
                "group": None,
                "is_blocking": False,
            }
        ],
    }


async def handle_models(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    data = [model_card(state, model_id) for model_id in list(state.models)]
    return json_response({"object": "list", "data": data}, content_type=JSON)


async def handle_systemone(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]

    async def real() -> web.Response:
        return decide(state, await request.read())

    return await respond(request, state.faults, real)


def _middlewares(state: VllmState) -> list[Any]:
    @web.middleware
    async def auth_and_fastapi_errors(request: web.Request, handler: Any) -> web.StreamResponse:
        if (
            state.required_bearer is not None
            and request.method != "OPTIONS"
            and request.path.startswith(GUARDED_PREFIXES)
            and bearer_token(request) != state.required_bearer
        ):
            return json_response({"error": "Unauthorized"}, status=401, content_type=JSON)
        try:
            return await handler(request)
        except web.HTTPNotFound:
            return json_response({"detail": "Not Found"}, status=404, content_type=JSON)
        except web.HTTPMethodNotAllowed as exc:
            resp = json_response({"detail": "Method Not Allowed"}, status=405, content_type=JSON)
            resp.headers["Allow"] = ", ".join(sorted(exc.allowed_methods))
            return resp

    return [recording_middleware(state.requests), auth_and_fastapi_errors]


def make_vllm_app(state: VllmState | None = None) -> web.Application:
    """An aiohttp application that speaks vLLM's protocol from `state`."""
    state = state if state is not None else VllmState()
    app = web.Application(client_max_size=CLIENT_MAX_SIZE, middlewares=_middlewares(state))
    app[STATE_KEY] = state
    app.router.add_get("/version", handle_version, allow_head=False)
    app.router.add_get("/health", handle_health, allow_head=False)
    app.router.add_get("/v1/models", handle_models, allow_head=False)
    app.router.add_post("/v1/systemone", handle_systemone)
    add_openai_routes(app)
    add_decisions_route(app)
    return app


def run_vllm_emulator(host: str, port: int, version: str) -> None:
    """Serve a vLLM emulator (default models) until interrupted."""
    serve_forever(make_vllm_app(VllmState(version=version)), host, port)
