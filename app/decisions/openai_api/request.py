"""The rules of an OpenAI Decisions API request (``POST /v1/decisions``), checked on the parsed body.

The contract is the OpenAI SDK's ``DecisionCreateParams`` narrowed to what every backend here
can answer (the same subset vLLM serves): ``input`` is a string or a list of user messages with
string content or ``input_text`` parts; questions are ``predicate``, ``choice`` (2 to 255
``choices``, values strings or booleans) or ``score`` (2 to 10 ``levels``); 1 to 64 questions. A
question's instructions and descriptions may also be any other JSON value (SPEC §1), asked as text.
Anything else (unknown fields, images, JSON parts, other roles, tool items, streaming) is a 400
that names the parameter, as OpenAI words it. The first problem found is reported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.decisions.openai_api.translate import is_parts
from app.decisions.schema import DecisionRequest
from app.errors import InvalidRequest

MAX_QUESTIONS = 64
CHOICES = (2, 255)
LEVELS = (2, 10)
SAFETY_IDENTIFIER_MAX = 64  # the Responses API's limit, which the SDK says this matches

TOP_FIELDS = ("model", "input", "questions", "safety_identifier", "prompt_cache_key", "prompt_cache_options")
_REFUSED_FIELDS = {
    "stream": "Streaming is not supported: /v1/decisions answers with one JSON object.",
    "stream_options": "Streaming is not supported: /v1/decisions answers with one JSON object.",
    "tools": "Tools are not supported by /v1/decisions.",
    "tool_choice": "Tools are not supported by /v1/decisions.",
    "parallel_tool_calls": "Tools are not supported by /v1/decisions.",
}
_QUESTION_FIELDS = {
    "predicate": frozenset({"type", "instructions", "name"}),
    "choice": frozenset({"type", "instructions", "name", "choices"}),
    "score": frozenset({"type", "instructions", "name", "levels"}),
}
_UNSUPPORTED_PARTS = {
    "input_image": "Image inputs are not supported by this gateway's decision models",
    "input_json": "JSON parts are not supported; send the JSON as text in an 'input_text' part",
    "input_file": "File inputs are not supported",
}
_TOOL_ITEMS = ("function_call", "function_call_output", "custom_tool_call", "custom_tool_call_output")


class OpenAIInvalidRequest(InvalidRequest):
    """A 400 that names the parameter (``param``) and the kind of problem (``code``), as OpenAI does."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


@dataclass(frozen=True, slots=True)
class OpenAIDecisionRequest:
    model: str
    safety_identifier: str | None

    @property
    def gateway(self) -> DecisionRequest:
        """What the Forwarder checks: no media here (images are refused above)."""
        return DecisionRequest(model=self.model, media=(), remote_media=False)


def validate(body: Any) -> OpenAIDecisionRequest:
    """Check ``body`` or raise OpenAIInvalidRequest naming the first problem."""
    if not isinstance(body, dict):
        raise OpenAIInvalidRequest("The request body must be a JSON object.", None, "invalid_type")
    for field in body:
        if field in _REFUSED_FIELDS:
            raise OpenAIInvalidRequest(_REFUSED_FIELDS[field], field, "unsupported_parameter")
        if field not in TOP_FIELDS:
            raise _unknown(field)
    for field in ("model", "input", "questions"):
        if field not in body:
            raise OpenAIInvalidRequest(f"Missing required parameter: '{field}'.", field,
                                       "missing_required_parameter")
    model = body["model"]
    if not isinstance(model, str) or not model:
        raise _type("model", "a non-empty string", model)
    _check_input(body["input"])
    _check_questions(body["questions"])
    safety = body.get("safety_identifier")
    if safety is not None:
        if not isinstance(safety, str):
            raise _type("safety_identifier", "a string", safety)
        if len(safety) > SAFETY_IDENTIFIER_MAX:
            raise OpenAIInvalidRequest(
                f"Invalid 'safety_identifier': string too long. Expected a string with maximum length "
                f"{SAFETY_IDENTIFIER_MAX}, but got a string with length {len(safety)} instead.",
                "safety_identifier", "string_above_max_length")
    key = body.get("prompt_cache_key")
    if key is not None and not isinstance(key, str):
        raise _type("prompt_cache_key", "a string", key)
    _check_cache_options(body.get("prompt_cache_options"))
    return OpenAIDecisionRequest(model=model, safety_identifier=safety)


# -- input ----------------------------------------------------------------------------------


def _check_input(value: Any) -> None:
    if isinstance(value, str):
        return
    if not isinstance(value, list):
        raise _type("input", "a string or an array of user messages", value)
    if not value:
        raise _empty("input")
    for index, item in enumerate(value):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise _type(where, "a message object", item)
        kind = item.get("type", "message")
        if kind in _TOOL_ITEMS:
            raise OpenAIInvalidRequest(f"Tool calls and tool outputs are not supported in '{where}': "
                                       "send user messages only.", f"{where}.type", "unsupported_value")
        if kind != "message":
            raise _value(f"{where}.type", kind, ("message",))
        if "role" not in item:
            raise OpenAIInvalidRequest(f"Missing required parameter: '{where}.role'.", f"{where}.role",
                                       "missing_required_parameter")
        if item["role"] != "user":
            if item["role"] in ("developer", "system", "assistant"):
                raise OpenAIInvalidRequest(
                    f"Unsupported role '{item['role']}' in '{where}.role': only 'user' messages are "
                    "supported.", f"{where}.role", "unsupported_value")
            raise _value(f"{where}.role", item["role"], ("user",))
        for field in item:
            if field not in ("type", "role", "content"):
                raise _unknown(f"{where}.{field}")
        if "content" not in item:
            raise OpenAIInvalidRequest(f"Missing required parameter: '{where}.content'.", f"{where}.content",
                                       "missing_required_parameter")
        _check_text(item["content"], f"{where}.content", breakpoints=True)


def _check_text(value: Any, where: str, *, breakpoints: bool) -> None:
    """A string, or a non-empty list of ``input_text`` parts."""
    if isinstance(value, str):
        return
    if not isinstance(value, list):
        raise _type(where, "a string or an array of 'input_text' parts", value)
    if not value:
        raise _empty(where)
    allowed = ("type", "text", "prompt_cache_breakpoint") if breakpoints else ("type", "text")
    for index, part in enumerate(value):
        at = f"{where}[{index}]"
        if not isinstance(part, dict):
            raise _type(at, "an 'input_text' part", part)
        kind = part.get("type")
        if isinstance(kind, str) and kind in _UNSUPPORTED_PARTS:
            raise OpenAIInvalidRequest(f"{_UNSUPPORTED_PARTS[kind]} ('{at}').", f"{at}.type", "unsupported_value")
        if kind != "input_text":
            raise _value(f"{at}.type", kind, ("input_text",))
        for field in part:
            if field not in allowed:
                raise _unknown(f"{at}.{field}")
        if not isinstance(part.get("text"), str):
            if "text" not in part:
                raise OpenAIInvalidRequest(f"Missing required parameter: '{at}.text'.", f"{at}.text",
                                           "missing_required_parameter")
            raise _type(f"{at}.text", "a string", part["text"])
        mark = part.get("prompt_cache_breakpoint")
        if mark is not None and mark != {"mode": "explicit"}:
            raise _type(f"{at}.prompt_cache_breakpoint", 'null or {"mode": "explicit"}', mark)


def _check_cache_options(value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        raise _type("prompt_cache_options", "an object", value)
    for field, item in value.items():
        if field == "mode":
            if item is not None and item not in ("implicit", "explicit"):
                raise _value("prompt_cache_options.mode", item, ("implicit", "explicit"))
        elif field == "ttl":
            if item != "30m":
                raise _value("prompt_cache_options.ttl", item, ("30m",))
        else:
            raise _unknown(f"prompt_cache_options.{field}")


# -- questions ------------------------------------------------------------------------------


def _check_questions(questions: Any) -> None:
    if not isinstance(questions, list):
        raise _type("questions", "an array of questions", questions)
    _check_length("questions", questions, 1, MAX_QUESTIONS)
    for index, question in enumerate(questions):
        where = f"questions[{index}]"
        if not isinstance(question, dict):
            raise _type(where, "a question object", question)
        if "type" not in question:
            raise OpenAIInvalidRequest(f"Missing required parameter: '{where}.type'.", f"{where}.type",
                                       "missing_required_parameter")
        qtype = question["type"]
        if not isinstance(qtype, str) or qtype not in _QUESTION_FIELDS:
            raise _value(f"{where}.type", qtype, tuple(_QUESTION_FIELDS))
        for field in question:
            if field not in _QUESTION_FIELDS[qtype]:
                raise _unknown(f"{where}.{field}")
        if question.get("instructions") is None:  # null means what leaving it out means
            raise OpenAIInvalidRequest(f"Missing required parameter: '{where}.instructions'.",
                                       f"{where}.instructions", "missing_required_parameter")
        instructions = question["instructions"]
        if isinstance(instructions, str) or is_parts(instructions):  # else any JSON value (SPEC §1)
            _check_text(instructions, f"{where}.instructions", breakpoints=False)
        name = question.get("name")
        if name is not None and not isinstance(name, str):
            raise _type(f"{where}.name", "a string", name)
        if qtype == "choice":
            _check_choices(question.get("choices"), f"{where}.choices")
        elif qtype == "score":
            _check_levels(question.get("levels"), f"{where}.levels")


def _check_choices(choices: Any, where: str) -> None:
    if choices is None:
        raise OpenAIInvalidRequest(f"Missing required parameter: '{where}'.", where, "missing_required_parameter")
    if not isinstance(choices, list):
        raise _type(where, "an array of choices", choices)
    _check_length(where, choices, *CHOICES)
    seen: set[tuple[type, Any]] = set()
    for index, choice in enumerate(choices):
        at = f"{where}[{index}]"
        _check_entry(choice, at, "value", ("value", "description"))
        value = choice["value"]
        if not isinstance(value, (str, bool)):
            raise _type(f"{at}.value", "a string or a boolean", value)
        typed = (type(value), value)
        if typed in seen:
            raise OpenAIInvalidRequest(f"Invalid '{at}.value': duplicate choice {_show(value)}. "
                                       "Each choice must be unique.", f"{at}.value", "duplicate_value")
        seen.add(typed)


def _check_levels(levels: Any, where: str) -> None:
    if levels is None:
        raise OpenAIInvalidRequest(f"Missing required parameter: '{where}'.", where, "missing_required_parameter")
    if not isinstance(levels, list):
        raise _type(where, "an array of levels", levels)
    _check_length(where, levels, *LEVELS)
    for index, level in enumerate(levels):
        at = f"{where}[{index}]"
        _check_entry(level, at, "label", ("label", "description"))
        if not isinstance(level["label"], str):
            raise _type(f"{at}.label", "a string", level["label"])


def _check_entry(entry: Any, at: str, required: str, fields: tuple[str, ...]) -> None:
    if not isinstance(entry, dict):
        raise _type(at, "an object", entry)
    for field in entry:
        if field not in fields:
            raise _unknown(f"{at}.{field}")
    if required not in entry:
        raise OpenAIInvalidRequest(f"Missing required parameter: '{at}.{required}'.", f"{at}.{required}",
                                   "missing_required_parameter")
    # A description is any JSON value (SPEC §1), asked as its compact JSON text (translate.text_of).


# -- messages, worded as OpenAI words them --------------------------------------------------


def _check_length(where: str, items: list[Any], low: int, high: int) -> None:
    if len(items) < low:
        raise OpenAIInvalidRequest(
            f"Invalid '{where}': array too short. Expected an array with minimum length {low}, "
            f"but got an array with length {len(items)} instead.", where,
            "empty_array" if not items else "array_below_min_length")
    if len(items) > high:
        raise OpenAIInvalidRequest(
            f"Invalid '{where}': array too long. Expected an array with maximum length {high}, "
            f"but got an array with length {len(items)} instead.", where, "array_above_max_length")


def _unknown(param: str) -> OpenAIInvalidRequest:
    return OpenAIInvalidRequest(f"Unknown parameter: '{param}'.", param, "unknown_parameter")


def _empty(param: str) -> OpenAIInvalidRequest:
    return OpenAIInvalidRequest(f"Invalid '{param}': empty array. Expected an array with minimum length 1, "
                                "but got an empty array instead.", param, "empty_array")


def _type(param: str, expected: str, value: Any) -> OpenAIInvalidRequest:
    return OpenAIInvalidRequest(f"Invalid type for '{param}': expected {expected}, but got "
                                f"{_json_kind(value)} instead.", param, "invalid_type")


def _value(param: str, value: Any, supported: tuple[Any, ...]) -> OpenAIInvalidRequest:
    options = ", ".join(_show(s) for s in supported)
    return OpenAIInvalidRequest(f"Invalid value: {_show(value)}. Supported values are: {options}.", param,
                                "invalid_value")


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f"'{value[:80]}'"
    if isinstance(value, int):
        return str(value)[:80]
    return _json_kind(value)


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return "a number"
