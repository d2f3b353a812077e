"""The playground of a decision model's card: the admin's own state and questions, asked through
the decision path of ``POST /v1/systemone`` (its strict JSON parser, SPEC §1's rules, the text
limit of the model's service, the capability checks and the forwarding path), pinned to the card's
service and billed to no project, as the card's Test is (testing.py).

Like Test it changes nothing, so it is not in the audit log; every run is in the metrics under the
project label ``_test``. The answer comes back whole (the raw JSON) and as figures for the page to
draw: each question's options with their probabilities, in the order the questions were asked.
"""

from __future__ import annotations

from typing import Any

import orjson

from app import jsonbody
from app.api.admin import testing
from app.decisions import schema
from app.decisions.forward import Forwarder, Outcome
from app.decisions.schema import DecisionRequest
from app.errors import InvalidRequest, ValidationFailed
from app.telemetry.observer import Observer
from app.telemetry.record import RequestRecord

EXAMPLE_STATE = "A customer writes: 'My card was charged twice for one order, and nobody answers my emails.'"
EXAMPLE_QUESTIONS: dict[str, Any] = {
    "team": {"type": "choice", "instructions": "Which team should handle this ticket?",
             "criteria": dict(testing.OPTIONS)},
    "urgent": {"type": "noul", "instructions": "Should someone reply within the hour?",
               "criteria": {"true": "money is moving, or the customer cannot use the account"}},
    "tone": {"type": "score", "instructions": "How upset is the customer?",
             "criteria": ["calm", "annoyed", "furious"]},
}
_JSON_START = ("{", "[", '"')


def example_questions() -> str:
    """The questions the form starts with, as the text it shows (indented JSON)."""
    return orjson.dumps(EXAMPLE_QUESTIONS, option=orjson.OPT_INDENT_2).decode()


def request_of(model: str, state: str, questions: str) -> tuple[dict[str, Any], DecisionRequest]:
    """The System One request the form's two texts make, checked as the API checks one (400 with
    the problem's place otherwise)."""
    body = {"model": model, "state": state_of(state), "questions": questions_of(questions)}
    return body, schema.validate(body)


def state_of(text: str) -> Any:
    """The state as typed: JSON when it starts as JSON does (an object, an array, a "string") or
    is ``null``; any other text is the state itself, as a string."""
    stripped = text.strip()
    if stripped == "null":
        return None
    if not stripped.startswith(_JSON_START):
        return stripped
    try:
        return jsonbody.loads(stripped.encode())
    except ValidationFailed as exc:
        raise InvalidRequest(f"State: {_reason(exc)}. Write plain text, or correct the JSON.") from exc


def questions_of(text: str) -> Any:
    if not text.strip():
        raise InvalidRequest('Questions: give at least one, as a JSON object of named questions '
                             '({"team": {"type": "choice", "criteria": {...}}})')
    try:
        return jsonbody.loads(text.encode())
    except ValidationFailed as exc:
        raise InvalidRequest(f"Questions: {_reason(exc)}") from exc


def _reason(error: ValidationFailed) -> str:
    return error.message.replace("the body", "it", 1)


async def run(forwarder: Forwarder, observer: Observer, *, public_name: str, service_id: int,
              body: dict[str, Any], request: DecisionRequest, request_id: str | None = None) -> dict[str, Any]:
    """Ask ``body`` on the card's service: the answer and its figures, or the refusal or the
    backend's error as it came (``ok`` false), with the latency."""
    headers = {"X-Request-Id": request_id} if request_id else {}

    async def call(record: RequestRecord) -> dict[str, Any]:
        outcome = await testing.decided(forwarder, body, request, service_id, headers, record)
        if outcome.status != 200:
            return testing.failed(record, outcome.status, outcome.body)
        data = testing.json_object(outcome.body)
        return {"ok": True, "status": 200, "questions": answers_view(body["questions"], data),
                "usage": _usage(data, outcome), "answer": data}
    result = await testing.recorded(observer, testing.unbilled_record(request_id, "decision", public_name), call)
    return {"kind": "decision", "model": public_name, **result}


def _usage(data: dict[str, Any], outcome: Outcome) -> dict[str, Any]:
    usage = data.get("usage")
    if isinstance(usage, dict):
        return usage
    return {"input_tokens": outcome.input_tokens, "output_tokens": outcome.output_tokens}


def answers_view(questions: dict[str, Any], data: dict[str, Any]) -> list[dict[str, Any]]:
    """Each question in the order asked: its answer's value, options with probabilities (for the
    bars), confidence and warnings. A question the answer left out is ``missing``."""
    answers = data.get("answers")
    answers = answers if isinstance(answers, dict) else {}
    views = []
    for qid, question in questions.items():
        view: dict[str, Any] = {"id": qid, "type": question.get("type"),
                                "instructions": _text(question.get("instructions")),
                                "warnings": testing.warnings_of(data, qid)}
        answer = answers.get(qid)
        if isinstance(answer, dict):
            view.update(_figures(question, answer))
        else:
            view.update(missing=True, options=[], value=None, confidence=None)
        views.append(view)
    return views


def _figures(question: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    kind = question.get("type")
    probabilities = answer.get("probabilities")
    options = [_option(name, p) for name, p in probabilities.items()] if isinstance(probabilities, dict) else []
    if kind == "choice":
        value = answer.get("choice")
    elif kind == "noul":
        value = _probability(answer.get("noul"))
        if not options and value is not None:  # Ollama gives the one figure: P(true)
            options = [_option("true", value), _option("false", 1.0 - value)]
    else:
        value = answer.get("score")
        legend = answer.get("legend")
        if isinstance(legend, dict):
            for option in options:
                if option["name"] in legend:
                    option["label"] = f"{option['name']}: {_text(legend[option['name']])}"
    return {"missing": False, "value": value if isinstance(value, str | int | float) else None,
            "options": options, "chosen": _chosen(kind, value, options),
            "confidence": _probability(answer.get("confidence"))}


def _option(name: str, p: Any) -> dict[str, Any]:
    return {"name": str(name), "label": str(name), "probability": _probability(p)}


def _chosen(kind: Any, value: Any, options: list[dict[str, Any]]) -> str | None:
    """The option the answer picked: a choice's own; otherwise the likeliest."""
    if kind == "choice":
        return value if isinstance(value, str) else None
    rated = [o for o in options if o["probability"] is not None]
    return max(rated, key=lambda o: o["probability"])["name"] if rated else None


def _probability(value: Any) -> float | None:
    """A number from the backend, when it is one (a bool is not)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _text(value: Any) -> str:
    """Instructions or a level as the page shows them: a string as it is, anything else as JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return orjson.dumps(value).decode()
