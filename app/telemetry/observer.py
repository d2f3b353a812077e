"""Where a finished request goes: metrics, the usage ledger and the access log, in that order.
Cheap and non-blocking: the ledger only appends to a buffer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from app.telemetry.logs import log_request
from app.telemetry.metrics import Metrics
from app.telemetry.record import RequestRecord
from app.telemetry.usage import UsageLedger

UNKNOWN_MODEL = "_unknown"


class Observer:
    def __init__(self, metrics: Metrics, ledger: UsageLedger, *, log_payloads: bool,
                 is_known: Callable[[str], bool] = lambda _name: True) -> None:
        self.metrics = metrics
        self.ledger = ledger
        self.log_payloads = log_payloads
        self._is_known = is_known

    def finish(self, record: RequestRecord, body: Any = None) -> None:
        # A name the caller made up (a 403 or 404) never becomes a metric label or a ledger
        # value: tenants must not choose label values or row contents of any length.
        if record.model is not None and not self._is_known(record.model):
            record.model = UNKNOWN_MODEL
        self.metrics.observe(record)
        self.ledger.add(record)
        state = body.get("state") if self.log_payloads and isinstance(body, dict) else None
        log_request(record, state)
