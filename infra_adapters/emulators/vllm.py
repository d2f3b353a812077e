"""A vLLM emulator: `/version`, `/health`, `/v1/models`, `/v1/systemone`,
`/v1/chat/completions` and `/v1/embeddings` (`vllm_openai`), and OpenAI's
`/v1/decisions` (`vllm_decisions`).

A model's `task` option says what it serves: "generate" (chat and decisions)
or "embed" (embeddings only; decisions and chat are a 501 as for a model without
their handler).

`/v1/systemone` refuses what vLLM 0.33 refuses, in its order
(vllm/entrypoints/generate/structured_decisions/): the body as pydantic checks
`StructuredDecisionRequest` (`extra="forbid"`: `keep_alive` or any unknown field
is a 400; `joint` a StrictBool; `instructions` a string), then the model, then
serving.py's `parse_questions` (a question's unknown fields, question_types.py
`build_question`), `_media`, `_admit` (`joint` needs DiffusionGemma, which the
emulator never serves) and the read (`enable_thinking`, a fixed-prompt model's
instructions, media URLs, the context length). The answers are `answers.vllm_answer`.

A question's `instructions` and its descriptions are any JSON value (`QuestionSpec`: `Any`); a
non-string is shown as question_types.py shows it, `str()` of the parsed value
(`answers.python_text`): in the token counts, and in a score's `legend` (each level's name).

Errors follow vLLM's OpenAI-style shape
`{"error": {"message", "type", "param", "code"}}` (`vllm_validation`); routes it
does not have answer as FastAPI does (`{"detail": "Not Found"}`); `--api-key`
guards the `/v1` routes only, with vLLM's own `{"error": "Unauthorized"}` 401.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from aiohttp import web

from .answers import count_tokens, python_text, question_tokens, text_of, usage, vllm_answer
from .faults import respond
from .recording import CLIENT_MAX_SIZE, bearer_token, json_response, recording_middleware
from .server import serve_forever
from .vllm_decisions import add_decisions_route
from .vllm_openai import add_openai_routes
from .vllm_state import (
    JSON,
    MAX_QUESTIONS,
    STATE_KEY,
    VllmError,
    VllmState,
    context_error,
    decisions_unsupported,
    default_model_options,
    default_vllm_models,
    error_response,
)
from .vllm_validation import (
    AnyS,
    BoolS,
    DictS,
    IntS,
    ListS,
    ModelS,
    NullableS,
    ParamError,
    RequestInvalid,
    StrS,
    StructuredDecisionError,
    check_cache_salt,
    parse_body,
    validate,
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

# vllm/entrypoints/openai/decisions/question_types.py: the registered types and their labels.
TYPE_LABELS = {"choice": 26, "noul": 2, "score": 10}
MEDIA_KEYS = {"images": "image", "audio": "audio", "videos": "video"}
GUARDED_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")
INT64 = 2**63

# vllm/entrypoints/generate/structured_decisions/protocol.py: QuestionSpec (extra allowed: the
# unknown fields are refused by serving.py) and StructuredDecisionRequest (extra="forbid").
QUESTION_SPEC = ModelS("QuestionSpec", [("type", StrS(), True), ("instructions", AnyS(), False),
                                        ("criteria", AnyS(), False)], forbid_extra=False)
_URLS = NullableS(ListS(StrS()))
STRUCTURED_DECISION_REQUEST = ModelS("StructuredDecisionRequest", [
    ("model", NullableS(StrS()), False),
    ("state", AnyS(), True),
    ("questions", DictS(QUESTION_SPEC), True),
    ("instructions", NullableS(StrS()), False),
    ("images", _URLS, False),
    ("audio", _URLS, False),
    ("videos", _URLS, False),
    ("chat_template_kwargs", NullableS(DictS(AnyS())), False),
    ("joint", BoolS(), False),
    ("cache_salt", NullableS(StrS()), False),
    ("priority", IntS(ge=-INT64, le=INT64 - 1), False),
    ("request_id", StrS(), False),
], forbid_extra=True)


# -- question_types.py: build_question ------------------------------------------


def _options(qid: str, qtype: str, criteria: Any) -> list[str]:
    """Each type's `parse_options`: the option names (their descriptions do not count here)."""
    if qtype == "choice":
        if not isinstance(criteria, dict) or not criteria:
            raise StructuredDecisionError(f"question {qid!r}: choice criteria must map option names to "
                                          "a description or null")
        return [str(name) for name in criteria]
    if qtype == "noul":
        if criteria is not None and (not isinstance(criteria, dict) or not criteria.keys() <= {"true", "false"}):
            raise StructuredDecisionError(f"question {qid!r}: noul criteria must be an object with true and false")
        return ["yes", "no"]
    if not isinstance(criteria, list) or len(criteria) < 2:
        raise StructuredDecisionError(f"question {qid!r}: score criteria must be an ordered list of levels")
    return [str(level) for level in criteria]


def build_question(qid: str, spec: dict[str, Any], opts: dict[str, Any]) -> None:
    """question_types.py `build_question` with the model's DecisionLimits."""
    if not qid:
        raise StructuredDecisionError("question ids must be non-empty")
    qtype = spec["type"]
    if qtype not in TYPE_LABELS:
        raise StructuredDecisionError(f"unknown question type {qtype!r}; supported: {sorted(TYPE_LABELS)}")
    names = _options(qid, qtype, spec.get("criteria"))
    if len(set(names)) != len(names):
        raise StructuredDecisionError(f"question {qid!r}: duplicate option names")
    labeled = bool(opts["instructions"])  # D3 scores its options without labels
    limit = min(int(opts["max_options"]), TYPE_LABELS[qtype]) if labeled else int(opts["max_options"])
    if len(names) > limit:
        raise StructuredDecisionError(f"question {qid!r}: at most {limit} options for this model")


def parse_questions(questions: dict[str, Any], opts: dict[str, Any]) -> None:
    """vllm/entrypoints/generate/structured_decisions/serving.py `parse_questions`."""
    if not questions:
        raise StructuredDecisionError("questions: needs at least one question")
    if len(questions) > MAX_QUESTIONS:
        raise StructuredDecisionError(f"questions: at most {MAX_QUESTIONS} for this model")
    for qid, spec in questions.items():
        extra = sorted(k for k in spec if k not in ("type", "instructions", "criteria"))
        if extra:
            raise StructuredDecisionError(f"question {qid!r}: unknown field(s) {extra}")
        build_question(qid, spec, opts)


def check_media_urls(media: dict[str, list[str]]) -> None:
    """How vLLM's MediaConnector refuses a URL before fetching it
    (vllm/multimodal/media/connector.py `load_from_url_async`); a read wraps it as "media: ..."."""
    for urls in media.values():
        for url in urls:
            if url[:5].lower() == "data:":
                spec, sep, _ = url[5:].partition(",")
                if not sep:
                    raise StructuredDecisionError(f"media: Invalid data URL {url[:32]!r}: missing ',' separator.")
                if spec.rpartition(";")[2] != "base64" or ";" not in spec:
                    raise VllmError("Only base64 data URLs are supported for now.", 501, "NotImplementedError")
            elif not url.lower().startswith(("http://", "https://", "file:")):
                raise StructuredDecisionError("media: The URL must be either a HTTP, data or file URL.")


def decide(state: VllmState, body: bytes) -> web.Response:
    """The `/v1/systemone` answer for `body`, refused as vLLM 0.33 refuses it."""
    try:
        payload = parse_body(body)
        check_cache_salt(payload)
        validate(STRUCTURED_DECISION_REQUEST, payload)
        model = payload.get("model")
        if model is None:  # BaseServing._is_model_supported: no model means the served one
            model = next(iter(state.models), "")
        if model not in state.models:
            raise state.unknown_model(model)
        opts = state.options(model)
        if decisions_unsupported(opts, state):  # structured_decisions/api_router.py: no handler
            raise VllmError("The model does not support the structured decision API", 501, "NotImplementedError")
        questions: dict[str, Any] = payload["questions"]
        # structured_decisions/serving.py `create_decision`, in its order.
        parse_questions(questions, opts)
        media = {MEDIA_KEYS[key]: payload[key] for key in MEDIA_KEYS if payload.get(key)}
        modalities = {MEDIA_KEYS[key] for key in opts["media"]}
        if unsupported := media.keys() - modalities:  # ServingStructuredDecisions._media
            raise StructuredDecisionError(f"this model does not take {', '.join(sorted(unsupported))} inputs")
        if payload.get("joint"):  # BaseServingDecisions._admit: only DiffusionGemma reads jointly
            raise StructuredDecisionError("joint: this model reads each question on its own; "
                                          "joint reads need DiffusionGemma")
        if not opts["instructions"]:
            if payload.get("instructions"):  # D3Strategy.read
                raise StructuredDecisionError("this model reads a fixed prompt, so it takes no instructions")
        elif (payload.get("chat_template_kwargs") or {}).get("enable_thinking"):  # NextTokenStrategy._read_request
            raise StructuredDecisionError("a read is the reply's first token, so thinking must be off")
        check_media_urls(media)
        state_tokens = count_tokens(text_of(payload["state"]))
        preamble_tokens = count_tokens(text_of(payload.get("instructions")))
        for qid, q in questions.items():
            error = context_error(qid, question_tokens(state_tokens, q, preamble_tokens, python_text), opts)
            if error is not None:
                raise error
    except (RequestInvalid, ParamError, StructuredDecisionError, VllmError) as exc:
        return exc.response()
    answers: dict[str, Any] = {}
    diagnostics: dict[str, Any] = {}
    for qid, q in questions.items():
        answers[qid], diagnostics[qid] = vllm_answer(payload["state"], q)
    body_out = {  # structured_decisions/protocol.py StructuredDecisionResponse
        "id": f"decision-{payload.get('request_id') or uuid.uuid4().hex}",
        "object": "structured_decision",
        "created": int(time.time()),
        "model": model,
        "answers": answers,
        "usage": usage(payload["state"], questions, payload.get("instructions"), python_text),
        "diagnostics": diagnostics,
        "joint": None,
    }
    return json_response(body_out, content_type=JSON)


# -- handlers ----------------------------------------------------------------


async def handle_version(request: web.Request) -> web.Response:
    version = request.app[STATE_KEY].version
    if version is None:  # standing in for an OpenAI-compatible server that is no vLLM: no such route
        return web.Response(status=404, body=b'{"detail":"Not Found"}', content_type="application/json")
    return json_response({"version": version}, content_type=JSON)


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
