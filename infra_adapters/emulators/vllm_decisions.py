"""vLLM's OpenAI Decisions API, `POST /v1/decisions` (vllm/entrypoints/openai/decisions/).

The body is checked as `DecisionRequest` (protocol.py: every model `extra="forbid"`, strict
strings and booleans, the length limits) and refused with vLLM's errors (`vllm_validation`).
Each question is read as a label question (adapters.py `make_read_question`): a predicate as
the choice `false`/`true` (labels A and B), a choice's values as their JSON text (`"true"` for
the string, `true` for the boolean), a score's levels by their labels; at most 26 options. The
input is the string, or the messages' texts (a message's `input_text` parts joined by "\\n", the
messages by "\\n\\n"; adapters.py `input_text`). A read's probabilities are those `/v1/systemone`
gives the same label question (`answers`): a choice question over the read's option names,
with their descriptions. Answers follow adapters.py `make_answer` (a predicate's probability is
that of `true`), and the body is serving.py's `DecisionResponse` (model, answers, usage; no id).
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from .answers import count_tokens, distribution, question_tokens
from .faults import faulty_route
from .recording import json_response
from .vllm_state import (
    JSON,
    MAX_QUESTIONS,
    STATE_KEY,
    VllmError,
    VllmState,
    context_error,
    decisions_unsupported,
)
from .vllm_validation import (
    BoolS,
    ListS,
    LiteralS,
    ModelS,
    NullableS,
    ParamError,
    RequestInvalid,
    StrS,
    StructuredDecisionError,
    TaggedUnionS,
    UnionS,
    check_cache_salt,
    parse_body,
    validate,
)

LABELS = 26  # question_types.py LABELS: A to Z

# -- protocol.py --------------------------------------------------------------------------

SHORT_TEXT = StrS(max_length=1048576)
INPUT_TEXT = StrS(max_length=10485760)


def _reject_images(data: dict[str, Any]) -> None:
    """DecisionInputMessage.reject_images."""
    content = data.get("content")
    if isinstance(content, list) and any(isinstance(p, dict) and p.get("type") == "input_image" for p in content):
        raise ValueError("Decisions supports text input only; images are not supported")


def _validate_question(data: dict[str, Any]) -> None:
    """QuestionBase.validate_name, then ChoiceQuestion.validate_choices."""
    if "name" in data and data["name"] is None:
        raise ValueError("name must be a string when provided")
    if data.get("type") == "choice":
        values = [(type(c["value"]), c["value"]) for c in data["choices"]]
        if len(set(values)) != len(values):
            raise ValueError("choice values must be distinct")


INPUT_TEXT_PART = ModelS("DecisionInputText", [("type", LiteralS("input_text"), True),
                                               ("text", INPUT_TEXT, True)], forbid_extra=True)
INPUT_MESSAGE = ModelS("DecisionInputMessage", [
    ("role", LiteralS("user"), True),
    ("content", UnionS(INPUT_TEXT, ListS(INPUT_TEXT_PART, max_length=16384)), True),
    ("type", LiteralS("message"), False),
], forbid_extra=True, before=_reject_images)
_BASE = [("instructions", SHORT_TEXT, True), ("name", NullableS(SHORT_TEXT), False)]
CHOICE_OPTION = ModelS("ChoiceOption", [("value", UnionS(StrS(), BoolS()), True),
                                        ("description", SHORT_TEXT, False)], forbid_extra=True)
SCORE_LEVEL = ModelS("ScoreLevel", [("label", SHORT_TEXT, True), ("description", SHORT_TEXT, False)],
                     forbid_extra=True)
QUESTION = TaggedUnionS({
    "predicate": ModelS("PredicateQuestion", [*_BASE, ("type", LiteralS("predicate"), True)],
                        forbid_extra=True, after=_validate_question),
    "choice": ModelS("ChoiceQuestion", [*_BASE, ("type", LiteralS("choice"), True),
                                        ("choices", ListS(CHOICE_OPTION, min_length=2, max_length=255), True)],
                     forbid_extra=True, after=_validate_question),
    "score": ModelS("ScoreQuestion", [*_BASE, ("type", LiteralS("score"), True),
                                      ("levels", ListS(SCORE_LEVEL, min_length=2, max_length=10), True)],
                    forbid_extra=True, after=_validate_question),
})
DECISION_REQUEST = ModelS("DecisionRequest", [
    ("model", SHORT_TEXT, True),
    ("input", UnionS(INPUT_TEXT, ListS(INPUT_MESSAGE, max_length=131072)), True),
    ("questions", ListS(QUESTION, min_length=1, max_length=200), True),
    ("safety_identifier", NullableS(StrS(max_length=128)), False),
    ("joint", BoolS(), False),
    ("cache_salt", NullableS(StrS(min_length=1, max_length=1024)), False),
], forbid_extra=True)

# -- adapters.py ----------------------------------------------------------------------------


def input_text(value: str | list[dict[str, Any]]) -> str:
    """adapters.py `input_text`."""
    if isinstance(value, str):
        return value
    return "\n\n".join(
        m["content"] if isinstance(m["content"], str) else "\n".join(p["text"] for p in m["content"])
        for m in value
    )


def read_options(question: dict[str, Any]) -> list[tuple[str, str]]:
    """adapters.py `make_read_question`: the read's options, (name, description), in order."""
    if question["type"] == "predicate":
        return [("false", ""), ("true", "")]
    if question["type"] == "choice":
        return [(json.dumps(c["value"], ensure_ascii=False), c.get("description", "")) for c in question["choices"]]
    return [(level["label"], level.get("description", "")) for level in question["levels"]]


def read_question(question: dict[str, Any]) -> dict[str, Any]:
    """The `/v1/systemone` choice question that reads as this question does."""
    return {"type": "choice", "instructions": question["instructions"],
            "criteria": {name: desc or None for name, desc in read_options(question)}}


def read_prompt(text: str, question: dict[str, Any]) -> str:
    """The user turn a next-token model reads for `question` (strategies.py `_content`,
    question_types.py `QuestionType.prompt` with letter labels)."""
    lines = [f"{chr(65 + i)}: {name} - {desc}" if desc else f"{chr(65 + i)}: {name}"
             for i, (name, desc) in enumerate(read_options(question))]
    lines.append("Answer with the letter of one option only.")
    body = "\n".join(lines)
    ask = f"Question: {question['instructions']}\n{body}" if question["instructions"] else body
    return f"{text}\n\n{ask}"


def answer(text: str, question: dict[str, Any]) -> dict[str, Any]:
    """adapters.py `make_answer` over the read's label probabilities."""
    q = read_question(question)
    d = distribution(text, "choice", q["instructions"], q["criteria"])
    name = question.get("name")
    if question["type"] == "predicate":
        return {"type": "predicate", "name": name, "probability": d.probs[1]}
    confidence = d.probs[d.argmax] * d.label_mass
    if question["type"] == "choice":
        values = [c["value"] for c in question["choices"]]
        return {"type": "choice", "name": name, "choice": values[d.argmax],
                "probabilities": [{"value": v, "probability": p} for v, p in zip(values, d.probs, strict=True)],
                "confidence": confidence}
    labels = [level["label"] for level in question["levels"]]
    return {"type": "score", "name": name, "score": d.expectation,
            "probabilities": [{"value": i, "label": label, "probability": p}
                              for i, (label, p) in enumerate(zip(labels, d.probs, strict=True))],
            "confidence": confidence}


def decide(state: VllmState, body: bytes) -> web.Response:
    """The `/v1/decisions` answer for `body`, refused as vLLM 0.33 refuses it."""
    try:
        payload = parse_body(body)
        check_cache_salt(payload)  # DecisionRequest.check_cache_salt_support
        validate(DECISION_REQUEST, payload)
        model = payload["model"]
        if model not in state.models:
            raise state.unknown_model(model)
        opts = state.options(model)
        # decisions/state.py: only a read strategy whose task is generate serves /v1/decisions.
        if decisions_unsupported(opts, state) or not opts["instructions"]:
            raise VllmError("The model does not support the Decisions API", 501, "NotImplementedError")
        questions: list[dict[str, Any]] = payload["questions"]
        # serving.py `create_decisions`, in its order.
        if len(questions) > MAX_QUESTIONS:
            raise StructuredDecisionError(f"questions: at most {MAX_QUESTIONS} for this model")
        limit = min(int(opts["max_options"]), LABELS)
        if any(len(read_options(q)) > limit for q in questions):
            raise StructuredDecisionError(f"This model supports at most {limit} choices per question")
        if payload.get("joint"):
            raise StructuredDecisionError("joint: this model reads each question on its own; "
                                          "joint reads need DiffusionGemma")
        text = input_text(payload["input"])
        state_tokens = count_tokens(text)
        reads = [question_tokens(state_tokens, read_question(q)) for q in questions]
        for i, tokens in enumerate(reads):
            error = context_error(str(i), tokens, opts)
            if error is not None:
                raise error
    except (RequestInvalid, ParamError, StructuredDecisionError, VllmError) as exc:
        return exc.response()
    tokens_in, tokens_out = sum(reads), len(questions)
    return json_response({  # protocol.py DecisionResponse
        "model": model,
        "answers": [answer(text, q) for q in questions],
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
