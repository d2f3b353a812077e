"""The rules of a System One request (SPEC §1), checked on the parsed body.

Hand-written rather than a pydantic model: it reads the parsed object in place,
so question order and unknown fields are untouched, nothing is copied, and every
problem is reported with its location.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.decisions import keep_alive
from app.errors import ValidationFailed, problem
from app.jsonbody import is_number
from infra_adapters.media import media_kind

MAX_QUESTIONS = 64
MAX_CHOICE_OPTIONS = 255
SCORE_LEVELS = (2, 10)
MEDIA_FIELDS = {"images": "vision", "audio": "audio", "videos": "video"}
# Items of one media field: a bound on what is checked on the loop and wrapped per item by an
# adapter (vLLM's data: URLs); a prompt takes a handful of images, never thousands.
MAX_MEDIA_ITEMS = 64
QUESTION_TYPES = ("choice", "noul", "score")


@dataclass(frozen=True, slots=True)
class DecisionRequest:
    """What the gateway needs to know about a valid request; the body stays as parsed."""

    model: str
    media: tuple[str, ...]  # the media fields present and non-empty
    remote_media: bool  # an http(s):// URL among them


def validate(body: Any) -> DecisionRequest:
    """Check ``body`` or raise ValidationFailed with every problem found."""
    if not isinstance(body, dict):
        raise ValidationFailed([problem((), "the body must be a JSON object", "model_attributes_type")])
    problems: list[dict[str, Any]] = []

    model = body.get("model")
    if "model" not in body:
        problems.append(problem(("model",), "field required", "missing"))
    elif not isinstance(model, str) or not model:
        problems.append(problem(("model",), "must be a non-empty string", "string_type"))

    if "state" not in body:
        problems.append(problem(("state",), "field required", "missing"))
    elif not _is_content(body["state"]):
        problems.append(problem(("state",), "must be a string, object, array or null", "content_type"))

    _check_questions(body, problems)

    if "keep_alive" in body and not keep_alive.valid(body["keep_alive"]):
        problems.append(problem(
            ("keep_alive",),
            "must be a number of seconds or a duration such as \"5m\" or \"1h30m\"",
            "duration_parsing",
        ))

    media, remote = _check_media(body, problems)
    if problems:
        raise ValidationFailed(problems)
    return DecisionRequest(model=model, media=media, remote_media=remote)  # type: ignore[arg-type]


def _is_content(value: Any) -> bool:
    return value is None or isinstance(value, (str, dict, list))


def _check_questions(body: dict[str, Any], problems: list[dict[str, Any]]) -> None:
    if "questions" not in body:
        problems.append(problem(("questions",), "field required", "missing"))
        return
    questions = body["questions"]
    if not isinstance(questions, dict):
        problems.append(problem(("questions",), "must be an object of named questions", "dict_type"))
        return
    if not 1 <= len(questions) <= MAX_QUESTIONS:
        problems.append(problem(
            ("questions",), f"must have 1 to {MAX_QUESTIONS} questions, not {len(questions)}",
            "too_short" if not questions else "too_long",
        ))
    for qid, question in questions.items():
        loc: tuple[Any, ...] = ("questions", qid)
        if not qid:
            problems.append(problem(loc, "a question id must be a non-empty string", "string_too_short"))
        if not isinstance(question, dict):
            problems.append(problem(loc, "a question must be an object", "dict_type"))
            continue
        _check_question(loc, question, problems)


def _check_question(loc: tuple[Any, ...], question: dict[str, Any], problems: list[dict[str, Any]]) -> None:
    qtype = question.get("type")
    if "type" not in question:
        problems.append(problem((*loc, "type"), "field required", "missing"))
        return
    if qtype not in QUESTION_TYPES:
        problems.append(problem(
            (*loc, "type"), f"must be one of 'choice', 'noul', 'score', not {qtype!r}", "literal_error"
        ))
        return
    # ``instructions`` and every description take any JSON value (SPEC §1): the backend shows it.
    where = (*loc, "criteria")
    criteria = question.get("criteria")
    if qtype == "choice":
        if not isinstance(criteria, dict):
            problems.append(problem(where, "a choice needs criteria: an object of option -> description or null",
                                    "missing" if criteria is None else "dict_type"))
        elif not 1 <= len(criteria) <= MAX_CHOICE_OPTIONS:
            problems.append(problem(where, f"a choice has 1 to {MAX_CHOICE_OPTIONS} options, not {len(criteria)}",
                                    "too_short" if not criteria else "too_long"))
    elif qtype == "score":
        low, high = SCORE_LEVELS
        if not isinstance(criteria, list):
            problems.append(problem(where, "a score needs criteria: a list of level descriptions, lowest first",
                                    "missing" if criteria is None else "list_type"))
        elif not low <= len(criteria) <= high:
            problems.append(problem(where, f"a score has {low} to {high} levels, not {len(criteria)}",
                                    "too_short" if len(criteria) < low else "too_long"))
        else:
            for index, level in enumerate(criteria):
                if level is None:
                    problems.append(problem((*where, index), "a level needs a description (any JSON value but "
                                            "null)", "none_forbidden"))
    elif criteria is not None:  # noul
        if not isinstance(criteria, dict):
            problems.append(problem(where, "must be null or an object with \"true\"/\"false\" keys", "dict_type"))
        else:
            for key in criteria:
                if key not in ("true", "false"):
                    problems.append(problem((*where, key), "only \"true\" and \"false\" are allowed",
                                            "extra_forbidden"))


def _check_media(body: dict[str, Any], problems: list[dict[str, Any]]) -> tuple[tuple[str, ...], bool]:
    present: list[str] = []
    remote = False
    for field in MEDIA_FIELDS:
        if field not in body:
            continue
        items = body[field]
        if items is None:
            continue
        if not isinstance(items, list):
            problems.append(problem((field,), "must be a list of base64 strings or data: URLs", "list_type"))
            continue
        if len(items) > MAX_MEDIA_ITEMS:
            problems.append(problem((field,), f"has {len(items)} items; at most {MAX_MEDIA_ITEMS} are accepted",
                                    "too_long"))
            continue
        for index, item in enumerate(items):
            kind = media_kind(item) if isinstance(item, str) and item else None
            if kind is None:
                problems.append(problem((field, index), "must be a base64 string or a data: URL", "string_type"))
            elif kind == "remote":
                remote = True
            elif kind == "other":
                problems.append(problem((field, index), "only base64 strings and data: URLs are accepted",
                                        "url_scheme"))
        if items:
            present.append(field)
    return tuple(present), remote


def is_numberish(value: Any) -> bool:  # re-exported for callers that check state types
    return is_number(value)
