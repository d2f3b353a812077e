"""What the gateway remembers of one request: fed to metrics, logs, the usage ledger and spans."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass


@dataclass(slots=True)
class RequestRecord:
    request_id: str
    operation: str  # "decision" or "chat"
    route: str
    model: str | None = None  # the public name of the model (an alias's target)
    alias: str | None = None  # the alias the caller named, when it named one
    project_id: int | None = None
    project: str | None = None
    key_id: int | None = None
    provider: str | None = None
    status: int = 0
    seconds: float = 0.0  # the whole request, as the gateway saw it
    backend_seconds: float = 0.0  # of which waiting on the backend
    input_tokens: int | None = None
    output_tokens: int | None = None
    error_type: str | None = None
    # The codes of a decision's warnings (app/routing/strategies/answer_warnings.py).
    warnings: tuple[str, ...] = ()
    at: dt.datetime | None = None
    # Caller-supplied labels, logged as they came (an OpenAI decision's safety_identifier);
    # never used to decide who the caller is.
    metadata: dict[str, str] | None = None
    # Forwarded by another mesh node: that node counts its tokens and usage, not this one.
    forwarded: bool = False
    # Where it went, as the duration histogram labels it: (server_address, server_port,
    # gen_ai_response_model) of the replica that answered or was tried last (``Replica.answered_by``,
    # ``tried_at``); None when no backend was reached.
    served_by: tuple[str, str, str] | None = None
    # The request's (trace_id, span_id) when tracing is on, for its access line (written later,
    # outside the request's context: observer.py).
    trace_ids: tuple[str, str] | None = None

    @property
    def overhead_seconds(self) -> float:
        return max(0.0, self.seconds - self.backend_seconds)

    @property
    def billable(self) -> bool:
        """Usage is recorded for a project's request once it got past authentication."""
        return self.project_id is not None
