"""Where a finished request goes: metrics, the usage ledger and the access log, in that order.
Cheap and non-blocking: the ledger only appends to a buffer."""

from __future__ import annotations

from typing import Any

from app.telemetry.logs import log_request
from app.telemetry.metrics import Metrics
from app.telemetry.record import RequestRecord
from app.telemetry.usage import UsageLedger


class Observer:
    def __init__(self, metrics: Metrics, ledger: UsageLedger, *, log_payloads: bool) -> None:
        self.metrics = metrics
        self.ledger = ledger
        self.log_payloads = log_payloads

    def finish(self, record: RequestRecord, body: Any = None) -> None:
        self.metrics.observe(record)
        self.ledger.add(record)
        state = body.get("state") if self.log_payloads and isinstance(body, dict) else None
        log_request(record, state)
