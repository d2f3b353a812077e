"""An OpenAI decision request as a System One request, and the System One answer as an OpenAI one.

For backends that speak only ``/v1/systemone`` (Ollama, Ollama Cloud, a vLLM without
``/v1/decisions``). The request is valid (``request.validate``) before it gets here.

    predicate            <-> noul      probability = noul
    choice  (choices)    <-> choice    criteria {option name: description}; names map back to the
                                       typed values (see ``option_names``)
    score   (levels)     <-> score     criteria [level text]; probabilities by level index

The state is the input's text as vLLM reads it: the string itself, or the messages joined by
blank lines, each message's ``input_text`` parts by "\\n". Questions are asked under their ``name`` when it is
unique, else as ``questions[i]``; answers come back in question order either way. Instructions and
descriptions that are neither text nor ``input_text`` parts (any other JSON value) are asked as
their compact JSON text (``text_of``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import orjson

from app.errors import BackendFailed

_SYSTEM_ONE_TYPE = {"predicate": "noul", "choice": "choice", "score": "score"}


@dataclass(frozen=True, slots=True)
class Asked:
    """One question as it was asked of the backend, with what is needed to read its answer."""

    qid: str  # the System One question id
    type: str  # the OpenAI type
    name: str | None
    values: tuple[str | bool, ...] = ()  # choice: the typed values, in request order
    options: tuple[str, ...] = ()  # choice: the option names they were asked as
    labels: tuple[str, ...] = ()  # score: the level labels


def is_parts(value: Any) -> bool:
    """Whether ``value`` is content parts (a list of objects that each name their ``type``), not
    a structured value."""
    return isinstance(value, list) and all(isinstance(part, dict) and "type" in part for part in value)


def text_of(content: Any) -> str:
    """A string; the text of ``input_text`` parts joined by "\\n", as vLLM joins the parts of
    one message (``vllm/entrypoints/openai/decisions/adapters.py`` ``input_text``); any other
    JSON value as compact JSON (numbers as the caller wrote them)."""
    if isinstance(content, str):
        return content
    if is_parts(content):
        return "\n".join(part["text"] for part in content)
    return orjson.dumps(content).decode()


def described(description: Any) -> str | None:
    """A choice's or level's description as asked: a string or null as it is, any other JSON
    value as its compact JSON text."""
    return description if description is None or isinstance(description, str) else text_of(description)


def state_of(value: Any) -> str:
    """The System One state of an OpenAI ``input``: one text."""
    if isinstance(value, str):
        return value
    return "\n\n".join(text_of(message["content"]) for message in value)


def option_names(values: list[str | bool]) -> list[str]:
    """Non-empty, unique option names that read like the values (the model reads them).

    A string is its own name and a boolean is "true" / "false"; where that name is empty or
    taken (the string "true" beside the boolean true), the option's position is added.
    """
    names: list[str] = []
    taken: set[str] = set()
    for index, value in enumerate(values):
        text = ("true" if value else "false") if isinstance(value, bool) else value
        name = text
        extra = 0
        while not name or name in taken:
            extra += 1
            name = f"{text} (option {index + 1})" if extra == 1 else f"{text} (option {index + 1}.{extra})"
        taken.add(name)
        names.append(name)
    return names


def to_systemone(body: dict[str, Any]) -> tuple[dict[str, Any], list[Asked]]:
    """The System One request for ``body`` (``model`` as given), and how to read its answers."""
    questions: dict[str, Any] = {}
    asked: list[Asked] = []
    names = [q.get("name") for q in body["questions"]]
    repeated = {n for n in names if n and names.count(n) > 1}
    for index, question in enumerate(body["questions"]):
        name = question.get("name")
        qid = name if name and name not in repeated else f"questions[{index}]"
        while qid in questions:
            qid = f"{qid}'"
        qtype = question["type"]
        asked_as: dict[str, Any] = {"type": _SYSTEM_ONE_TYPE[qtype],
                                    "instructions": text_of(question["instructions"])}
        if qtype == "choice":
            values = [c["value"] for c in question["choices"]]
            options = option_names(values)
            asked_as["criteria"] = {option: described(choice.get("description"))
                                    for option, choice in zip(options, question["choices"], strict=True)}
            asked.append(Asked(qid, qtype, name, values=tuple(values), options=tuple(options)))
        elif qtype == "score":
            levels = question["levels"]
            asked_as["criteria"] = [f"{lv['label']}: {text}" if (text := described(lv.get("description")))
                                    else lv["label"] for lv in levels]
            asked.append(Asked(qid, qtype, name, labels=tuple(lv["label"] for lv in levels)))
        else:
            asked.append(Asked(qid, qtype, name))
        questions[qid] = asked_as
    return {"model": body["model"], "state": state_of(body["input"]), "questions": questions}, asked


def read_answer(body: bytes) -> dict[str, Any]:
    """A backend's System One answer as an object; BackendFailed (502) when it is not a JSON object.

    What orjson refuses although it is JSON (a number past a double's range such as ``1e400``, a
    lone surrogate escape) is read by the standard library's parser, which gives numbers as floats,
    as the translation reads them (``jsonbody`` would keep them as text)."""
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        try:
            answer = json.loads(body, parse_constant=_not_json)
        except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            answer = None
    if not isinstance(answer, dict):
        raise _unreadable("it is not a JSON object")
    return answer


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def from_systemone(answer: dict[str, Any], asked: list[Asked], model: str) -> dict[str, Any]:
    """The OpenAI answer for a System One ``answer``; BackendFailed (502) when it does not fit."""
    given = answer.get("answers")
    if not isinstance(given, dict):
        raise _unreadable("it has no 'answers' object")
    answers = [_answer(given.get(q.qid), q) for q in asked]
    return {"model": model, "answers": answers, "usage": _usage(answer.get("usage"))}


def _answer(given: Any, q: Asked) -> dict[str, Any]:
    if not isinstance(given, dict):
        raise _unreadable(f"question '{q.qid}' has no answer")
    if q.type == "predicate":
        return {"type": "predicate", "name": q.name, "probability": _probability(given.get("noul"), q)}
    probabilities = given.get("probabilities")
    if not isinstance(probabilities, dict):
        raise _unreadable(f"the answer to question '{q.qid}' has no probabilities")
    if q.type == "choice":
        shares = [_probability(probabilities.get(option, 0.0), q) for option in q.options]
        chosen = given.get("choice")
        if chosen not in q.options:
            raise _unreadable(f"the answer to question '{q.qid}' chose {chosen!r}, which was not offered")
        return {"type": "choice", "name": q.name, "choice": q.values[q.options.index(chosen)],
                "confidence": _confidence(given.get("confidence"), shares),
                "probabilities": [{"value": value, "probability": p} for value, p in zip(q.values, shares,
                                                                                         strict=True)]}
    shares = [_probability(probabilities.get(str(level), 0.0), q) for level in range(len(q.labels))]
    score: Any = given.get("score")
    return {"type": "score", "name": q.name,
            "score": float(score) if _is_number(score) else math.fsum(i * p for i, p in enumerate(shares)),
            "confidence": _confidence(given.get("confidence"), shares),
            "probabilities": [{"value": i, "label": label, "probability": p}
                              for i, (label, p) in enumerate(zip(q.labels, shares, strict=True))]}


def _probability(value: Any, q: Asked) -> float:
    if not _is_number(value) or not -1e-6 <= float(value) <= 1.0 + 1e-6:
        raise _unreadable(f"the answer to question '{q.qid}' has a probability that is not a number "
                          "from 0 to 1")
    return min(1.0, max(0.0, float(value)))


def _confidence(value: Any, shares: list[float]) -> float:
    """The backend's confidence; when it gives none, Ollama's: 1 - H / ln(n)."""
    if _is_number(value):
        return float(value)
    n = len(shares)
    entropy = -math.fsum(p * math.log(p) for p in shares if p > 0.0)
    return min(1.0, max(0.0, 1.0 - entropy / math.log(n))) if n > 1 else 1.0


def _usage(usage: Any) -> dict[str, Any]:
    usage = usage if isinstance(usage, dict) else {}
    tokens_in = _count(usage.get("input_tokens"))
    tokens_out = _count(usage.get("output_tokens"))
    details = usage.get("input_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else _count(usage.get("cached_tokens"))
    return {"input_tokens": tokens_in,
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": tokens_out,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": tokens_in + tokens_out}


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _unreadable(why: str) -> BackendFailed:
    return BackendFailed(502, f"the backend's System One answer cannot be read as an OpenAI decision: {why}")
