"""vLLM's OpenAI Decisions API, `POST /v1/decisions` (its text-only MVP).

`input` is a string or a list of user messages with string content or `input_text` parts;
questions are `predicate`, `choice` (values strings or booleans, 2 to the model's
`max_options`, 26 labels) or `score` (2 to 10 levels), 1 to 64 of them. Fields outside the
OpenAI schema are refused, except vLLM's `cache_salt`. Answers use the shared maths of
`answers` (the same distribution as `/v1/systemone` for the same state, type, instructions and
options) with vLLM's label confidence; usage counts one read per question. Errors have vLLM's
`{"error": {"message", "type", "param", "code"}}` shape.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from aiohttp import web

from .answers import count_tokens, distribution, question_tokens
from .faults import faulty_route
from .recording import is_missing, json_response, parse_json
from .vllm_state import JSON, STATE_KEY, VllmError, VllmState

MAX_QUESTIONS = 64
LEVELS = (2, 10)
FIELDS = frozenset({"model", "input", "questions", "safety_identifier", "prompt_cache_key",
                    "prompt_cache_options", "cache_salt"})
QUESTION_FIELDS = {"predicate": frozenset({"type", "name", "instructions"}),
                   "choice": frozenset({"type", "name", "instructions", "choices"}),
                   "score": frozenset({"type", "name", "instructions", "levels"})}
SYSTEM_ONE_TYPE = {"predicate": "noul", "choice": "choice", "score": "score"}


def _field_error(loc: str, msg: str) -> VllmError:
    return VllmError(f"1 validation error for DecisionRequest\n{loc}\n  {msg}")


def _text(value: Any, loc: str) -> str:
    """A string, or the text of `input_text` parts (joined by blank lines)."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list) or not value:
        raise _field_error(loc, "Input should be a valid string or a non-empty list of input_text parts")
    texts = []
    for i, part in enumerate(value):
        if not isinstance(part, dict) or part.get("type") != "input_text" or not isinstance(part.get("text"), str):
            raise VllmError(f"Unsupported content part at {loc}[{i}]: only input_text parts are supported.",
                            param=f"{loc}[{i}]")
        texts.append(part["text"])
    return "\n\n".join(texts)


def _input_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if not isinstance(value, list) or not value:
        raise _field_error("input", "Input should be a valid string or a non-empty list of messages")
    texts = []
    for i, message in enumerate(value):
        if (not isinstance(message, dict) or message.get("role") != "user"
                or message.get("type", "message") != "message"
                or set(message) - {"type", "role", "content"}):
            raise VllmError(f"Unsupported input item at input[{i}]: only user messages are supported.",
                            param=f"input[{i}]")
        texts.append(_text(message.get("content"), f"input[{i}].content"))
    return "\n\n".join(texts)


def _check_question(i: int, q: Any, opts: dict[str, Any]) -> None:
    loc = f"questions[{i}]"
    if not isinstance(q, dict):
        raise _field_error(loc, "Input should be a valid dictionary")
    qtype = q.get("type")
    if qtype not in QUESTION_FIELDS:
        raise _field_error(f"{loc}.type", "Input should be 'predicate', 'choice' or 'score'")
    extra = [k for k in q if k not in QUESTION_FIELDS[qtype]]
    if extra:
        raise _field_error(f"{loc}.{extra[0]}", "Extra inputs are not permitted")
    if "instructions" not in q:
        raise _field_error(f"{loc}.instructions", "Field required")
    if not opts["instructions"]:
        raise VllmError(f"Question {i}: this model does not accept instructions.", param=f"{loc}.instructions")
    if "name" in q and q["name"] is not None and not isinstance(q["name"], str):
        raise _field_error(f"{loc}.name", "Input should be a valid string")
    if qtype == "choice":
        choices = q.get("choices")
        if not isinstance(choices, list):
            raise _field_error(f"{loc}.choices", "Input should be a valid list")
        hi = int(opts["max_options"])
        if not 2 <= len(choices) <= hi:
            raise VllmError(f"Question {i}: a choice takes 2 to {hi} choices, got {len(choices)}.",
                            param=f"{loc}.choices")
        seen: set[tuple[type, Any]] = set()
        for j, choice in enumerate(choices):
            value = choice.get("value") if isinstance(choice, dict) else None
            if not isinstance(value, str | bool) or set(choice) - {"value", "description"}:
                raise _field_error(f"{loc}.choices.{j}", "Input should be {value: string | boolean, description?}")
            if (type(value), value) in seen:
                raise VllmError(f"Question {i}: choice values must be unique.", param=f"{loc}.choices")
            seen.add((type(value), value))
    elif qtype == "score":
        levels = q.get("levels")
        if not isinstance(levels, list) or any(
                not isinstance(lv, dict) or not isinstance(lv.get("label"), str) for lv in levels):
            raise _field_error(f"{loc}.levels", "Input should be a valid list of {label, description?}")
        lo, hi = LEVELS
        if not lo <= len(levels) <= hi:
            raise VllmError(f"Question {i}: a score takes {lo} to {hi} levels, got {len(levels)}.",
                            param=f"{loc}.levels")


def _criteria(q: dict[str, Any]) -> Any:
    """What the shared answer maths reads for a question's options."""
    if q["type"] == "choice":
        return [[c["value"], c.get("description")] for c in q["choices"]]
    if q["type"] == "score":
        return [lv["label"] for lv in q["levels"]]
    return None


def _answer(state: str, q: dict[str, Any], instructions: str) -> dict[str, Any]:
    qtype = q["type"]
    d = distribution(state, SYSTEM_ONE_TYPE[qtype], instructions, _criteria(q))
    name = q.get("name")
    if qtype == "predicate":
        return {"type": "predicate", "name": name, "probability": d.probs[0]}
    if qtype == "choice":
        values = [c["value"] for c in q["choices"]]
        return {"type": "choice", "name": name, "choice": values[d.argmax], "confidence": d.label_confidence(),
                "probabilities": [{"value": v, "probability": p} for v, p in zip(values, d.probs, strict=True)]}
    labels = [lv["label"] for lv in q["levels"]]
    return {"type": "score", "name": name, "score": d.expectation, "confidence": d.label_confidence(),
            "probabilities": [{"value": i, "label": label, "probability": p}
                              for i, (label, p) in enumerate(zip(labels, d.probs, strict=True))]}


def _read_tokens(state_tokens: int, q: dict[str, Any], instructions: str) -> int:
    criteria: Any = _criteria(q)
    if q["type"] == "choice":
        criteria = {str(value): desc for value, desc in criteria}
    return question_tokens(state_tokens, {"type": SYSTEM_ONE_TYPE[q["type"]], "instructions": instructions,
                                          "criteria": criteria})


def decide(state: VllmState, body: bytes) -> web.Response:
    """The `/v1/decisions` answer for `body`, validated as vLLM does."""
    payload = parse_json(body)
    try:
        if is_missing(payload) or not isinstance(payload, dict):
            raise VllmError("JSON decode error" if body.strip() else "Field required: body")
        extra = [k for k in payload if k not in FIELDS]
        if extra:
            raise _field_error(extra[0], "Extra inputs are not permitted")
        for key in ("model", "input", "questions"):
            if key not in payload:
                raise _field_error(key, "Field required")
        model = payload["model"]
        if not isinstance(model, str) or model not in state.models:
            raise VllmError(f"The model `{model}` does not exist.", 404, "NotFoundError", param="model")
        opts = state.options(model)
        if not opts["read_strategy"] or opts["task"] == "embed":
            raise VllmError(f"Model `{model}` has no read strategy for structured decisions.", 501,
                            "NotImplementedError")
        salt = payload.get("cache_salt")
        if "cache_salt" in payload and (not isinstance(salt, str) or not salt):
            raise VllmError("Parameter 'cache_salt' must be a non-empty string if provided.", param="cache_salt")
        text = _input_text(payload["input"])
        questions = payload["questions"]
        if not isinstance(questions, list) or not 1 <= len(questions) <= MAX_QUESTIONS:
            raise VllmError(f"A request takes 1 to {MAX_QUESTIONS} questions.", param="questions")
        for i, q in enumerate(questions):
            _check_question(i, q, opts)
        instructions = [_text(q["instructions"], f"questions[{i}].instructions") for i, q in enumerate(questions)]
        state_tokens = count_tokens(text)
        reads = [_read_tokens(state_tokens, q, ins) for q, ins in zip(questions, instructions, strict=True)]
        limit = int(opts["max_model_len"])
        if max(reads) + 1 > limit:
            raise VllmError(f"This model's maximum context length is {limit} tokens. However, your request "
                            f"has {max(reads)} input tokens. Please reduce the length of the input.")
    except VllmError as exc:
        return exc.response()
    answers = [_answer(text, q, ins) for q, ins in zip(questions, instructions, strict=True)]
    tokens_in, tokens_out = sum(reads), len(questions)
    return json_response({
        "id": f"decision-{uuid.uuid4().hex}", "object": "decision", "created": int(time.time()),
        "model": model, "answers": answers,
        "usage": {"input_tokens": tokens_in, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                  "output_tokens": tokens_out, "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": tokens_in + tokens_out},
    }, content_type=JSON)


async def _handle(request: web.Request, state: VllmState) -> web.Response:
    if not state.openai_decisions:
        raise web.HTTPNotFound()  # answered as FastAPI answers an unknown route
    return decide(state, await request.read())


def add_decisions_route(app: web.Application) -> None:
    app.router.add_post("/v1/decisions", faulty_route(STATE_KEY, _handle))
