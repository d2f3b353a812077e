"""The Test action of a model card: one request through the same forwarding path tenants use,
pinned to that card's service, billed to no project (its project label is `_test`). The card's
playground (playground.py) runs the same way, with the admin's own state and questions.

Both drive the decision path and chat's, so they live above both, in the API layer; what they
read of the card comes from the domain (services.card_target)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from app import jsonbody
from app.chat.forward import ChatForwarder
from app.decisions.forward import Forwarder, Outcome
from app.decisions.schema import DecisionRequest
from app.errors import ArbiterError
from app.services.catalog import model_kind
from app.telemetry.observer import Observer
from app.telemetry.record import RequestRecord
from app.tenancy.principal import Principal

TEST_PROJECT = "_test"
TEST_PRINCIPAL = Principal(key_id=0, kind="project", key_prefix="", project_id=None, project_name=TEST_PROJECT,
                           allowed_models=None, archived=False, expires_at=None, revoked_at=None)
OPTIONS = {"billing": "payments, refunds and charges", "shipping": "deliveries and parcels",
           "security": "account access and passwords"}


def decision_body(model: str) -> dict[str, Any]:
    return {"model": model, "state": "A customer writes: 'My card was charged twice for one order.'",
            "questions": {"test": {"type": "choice", "instructions": "Which team should handle this ticket?",
                                   "criteria": dict(OPTIONS)}}}


async def run(forwarder: Forwarder, chat: ChatForwarder, observer: Observer, *, public_name: str,
              service_id: int, capabilities: list[str], request_id: str | None = None) -> dict[str, Any]:
    kind = model_kind(capabilities)
    headers = {"X-Request-Id": request_id} if request_id else {}

    async def call(record: RequestRecord) -> dict[str, Any]:
        if kind == "decision":
            return await _decision(forwarder, public_name, service_id, headers, record)
        if kind in ("completion", "embedding"):
            return await _other(chat, kind, public_name, service_id, headers, record)
        return {"ok": False, "status": None, "error": "this model has no capability that can be tested"}
    result = await recorded(observer, unbilled_record(request_id, "decision" if kind == "decision" else "chat",
                                                  public_name), call)
    return {"kind": kind, "model": public_name, **result}


def unbilled_record(request_id: str | None, operation: str, public_name: str) -> RequestRecord:
    """The record of a Test (or a playground run): project ``_test`` and no project id, so it is
    in the metrics and billed to no project."""
    return RequestRecord(request_id or "", operation, "test", model=public_name, project=TEST_PROJECT)


async def recorded(observer: Observer, record: RequestRecord,
                   call: Callable[[RequestRecord], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    """``call(record)``'s result with its latency, every run in the metrics (one that broke too);
    an ArbiterError (the decision path's refusal, a backend away) is a result that says so."""
    started = time.perf_counter()
    result: dict[str, Any] | None = None
    try:
        result = await call(record)
    except ArbiterError as error:
        result = {"ok": False, "status": error.status, "error": error.message, "source": "arbiter"}
        record.error_type, record.backend_seconds = error.error_type, error.backend_seconds
        record.served_by = error.served_by
    finally:  # every Test is in the metrics, one that broke too
        if result is None:
            record.error_type = "internal_error"
        record.status = (result.get("status") or 0) if result is not None else 500
        record.seconds = time.perf_counter() - started
        observer.finish(record)
    return {"latency_ms": round(record.seconds * 1000, 1), **result}


async def _decision(forwarder: Forwarder, model: str, service_id: int, headers: dict[str, str],
                    record: RequestRecord) -> dict[str, Any]:
    body = decision_body(model)
    outcome = await decided(forwarder, body, DecisionRequest(model, (), False), service_id, headers, record)
    if outcome.status != 200:
        return failed(record, outcome.status, outcome.body)
    data = json_object(outcome.body)
    answers = data.get("answers")
    answer = answers.get("test") if isinstance(answers, dict) else None
    if not isinstance(answer, dict):
        return {"ok": False, "status": 200, "error": "the answer has no 'test' answer: "
                + outcome.body.decode("utf-8", "replace")[:500]}
    return {"ok": True, "status": 200, "question": body["questions"]["test"]["instructions"],
            "choice": answer.get("choice"), "probabilities": answer.get("probabilities"),
            "confidence": answer.get("confidence"), "warnings": warnings_of(data, "test")}


async def decided(forwarder: Forwarder, body: dict[str, Any], request: DecisionRequest, service_id: int,
                  headers: dict[str, str], record: RequestRecord) -> Outcome:
    """``body`` decided as a tenant's request is (the text limit, the capability checks, the
    forwarding path), on the card's service only and as no project; noted on ``record``."""
    outcome = await forwarder.decide(TEST_PRINCIPAL, body, request, len(jsonbody.dumps(body)), headers,
                                     only=service_id)
    record.provider, record.backend_seconds = outcome.provider, outcome.backend_seconds
    record.served_by = outcome.served_by
    record.input_tokens, record.output_tokens = outcome.input_tokens, outcome.output_tokens
    record.warnings = outcome.warnings
    return outcome


def warnings_of(data: dict[str, Any], qid: str) -> list[dict[str, str]]:
    """A question's warnings (``diagnostics.<question>.warnings``,
    app/routing/strategies/answer_warnings.py), as the card shows them: each with a string code
    and message; none when the answer has none."""
    diagnostics = data.get("diagnostics")
    entry = diagnostics.get(qid) if isinstance(diagnostics, dict) else None
    listed = entry.get("warnings") if isinstance(entry, dict) else None
    if not isinstance(listed, list):
        return []
    return [{"code": str(w.get("code")), "message": str(w.get("message") or "")}
            for w in listed if isinstance(w, dict)]


async def _other(chat: ChatForwarder, kind: str, model: str, service_id: int,
                 headers: dict[str, str], record: RequestRecord) -> dict[str, Any]:
    if kind == "completion":
        api = "openai-chat"
        body: dict[str, Any] = {"model": model, "stream": False, "max_tokens": 32,
                                "messages": [{"role": "user", "content": "Say hello in one short sentence."}]}
    else:
        api, body = "embed", {"model": model, "input": "Arbiter model test"}
    replicas = [r for r in chat.check(None, body, api) if r.service_id == service_id]
    if not replicas:
        return {"ok": False, "status": 404, "error": "that service does not serve this model"}
    answer = await chat.open(replicas, body, api, headers)
    record.provider, record.served_by = answer.replica.provider, answer.replica.answered_by
    try:
        payload = await answer.whole()  # a failure there is an ArbiterError, as one before it
    finally:
        record.backend_seconds = answer.waited
        await answer.close()
    if answer.status != 200:
        return failed(record, answer.status, payload)
    data = json_object(payload)
    if kind == "completion":
        reply = _reply(data)
        if reply is False:
            return _unexpected(record, payload)
        return {"ok": True, "status": 200, "prompt": body["messages"][0]["content"], "reply": reply}
    vector = _first_vector(data)
    if vector is None:
        return _unexpected(record, payload)
    return {"ok": True, "status": 200, "dimensions": len(vector), "head": vector[:4]}


def _reply(data: dict[str, Any]) -> str | None | bool:
    """The first choice's message content (None when it has none, as a reasoning model's may);
    False when the answer is not shaped as a chat completion."""
    choices = data.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    message = first.get("message") if isinstance(first, dict) else None
    content = message.get("content") if isinstance(message, dict) else False
    return content if content is None or isinstance(content, str) else False


def _first_vector(data: dict[str, Any]) -> list[float] | None:
    """The first embedding of Ollama's ``embeddings`` or OpenAI's ``data``; None when malformed."""
    if "embeddings" in data:
        vectors = data["embeddings"]
    else:
        items = data.get("data")
        vectors = ([i.get("embedding") if isinstance(i, dict) else None for i in items]
                   if isinstance(items, list) else None)
    first = vectors[0] if isinstance(vectors, list) and vectors else None
    if not isinstance(first, list) or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in first):
        return None
    return first


def json_object(body: bytes) -> dict[str, Any]:
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def failed(record: RequestRecord, status: int, body: bytes) -> dict[str, Any]:
    """The backend's error as it came (as text, for the card); its status is the error type, as
    for a tenant's request."""
    record.error_type = str(status)
    return {"ok": False, "status": status, "error": body.decode("utf-8", "replace")[:2000], "source": "backend"}


def _unexpected(record: RequestRecord, body: bytes) -> dict[str, Any]:
    """A 200 that is not what the API promises: a bad gateway, as the forwarding path says of one."""
    record.error_type = "backend_error"
    return {"ok": False, "status": 502, "error": "unexpected answer: " + body.decode("utf-8", "replace")[:500]}
