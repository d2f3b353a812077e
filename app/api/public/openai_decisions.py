"""POST /v1/decisions: the OpenAI Decisions API on every decision model, whatever its backend
speaks (lean ASGI, the /v1/systemone route in another dialect).

The same key, caps, allowlist, limits, usage, metrics and traces as /v1/systemone, in the same
order; what differs is the request's rules (``openai_api.request``), the forwarding
(``openai_api.forward``: straight to a vLLM's own /v1/decisions, else translated onto System
One) and the error shape: every error here, Arbiter's or a backend's, is
``{"error": {"message", "type", "param", "code"}}``, which is what OpenAI's clients parse.
"""

from __future__ import annotations

from typing import Any

from app.api.asgi import Receive, Scope, Send, send_bytes
from app.api.public.systemone import SystemOneRoute, passed_on
from app.decisions.forward import Outcome
from app.decisions.openai_api import errors
from app.decisions.openai_api import request as openai_request
from app.decisions.schema import DecisionRequest
from app.errors import ArbiterError, MethodNotAllowed
from app.telemetry.record import RequestRecord

OPENAI_DECISIONS_PATH = "/v1/decisions"


async def send_openai_error(send: Send, error: ArbiterError, *, close: bool = False) -> None:
    await send_bytes(send, error.status, errors.from_arbiter(error), "application/json", error.headers,
                     close=close)


class OpenAIDecisionsRoute(SystemOneRoute):
    """Takes every method on its path, so that a wrong one is a 405 in the OpenAI shape too."""

    takes_forms = False  # OpenAI's Decisions API has no multipart bodies

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] != "POST":
            await send_openai_error(send, MethodNotAllowed(
                f"{scope['method']} is not allowed on {OPENAI_DECISIONS_PATH}; use POST",
                headers={"Allow": "POST"}))
            return
        await super().__call__(scope, receive, send)

    async def send_error(self, send: Send, error: ArbiterError, *, close: bool = False) -> None:
        await send_openai_error(send, error, close=close)

    def prepare(self, body: Any, record: RequestRecord) -> DecisionRequest:
        request = openai_request.validate(body)
        record.model = request.model
        if request.safety_identifier is not None:  # metadata for the log, never a credential
            record.metadata = {"safety_identifier": request.safety_identifier}
        return request.gateway

    async def reply(self, send: Send, outcome: Outcome) -> None:
        if outcome.status == 200:
            await send_bytes(send, 200, outcome.body, outcome.content_type)
            return
        # A backend's own error: its status and message, in this endpoint's shape.
        body = errors.from_backend(outcome.status, outcome.content_type, outcome.body)
        await send_bytes(send, outcome.status, body, "application/json", passed_on(outcome))

    def logged(self, body: Any) -> Any:
        return {"state": body.get("input")} if isinstance(body, dict) else None
