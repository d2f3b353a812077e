"""Where a finished request goes: metrics, the usage ledger and the access log, in that order.

Not at once: ``finish`` only keeps the record, and the bookkeeping runs when the event loop has
time for it. A request's answer is out by then, but the process is not idle: at concurrency 1
the client's next request would arrive while it was still doing the last one's bookkeeping, and
wait for it (measured on bench/run.py: 35-80 µs a request, a tenth to a sixth of what Arbiter
adds). So the next request that arrives schedules the bookkeeping (``soon``) to run right after
its own task first waits, which on the hot path is on its backend: the work fills a wait that is
there anyway. A timer (``LATEST``) does it when no request comes, and ``drain`` does it on
demand (a metrics scrape, the shutdown's last usage write). Cheap and non-blocking either way:
the ledger only appends to a buffer."""

from __future__ import annotations

import asyncio
import contextvars
import datetime as dt
import logging
from collections.abc import Callable
from typing import Any

from app.telemetry.logs import current_trace_ids, log_request
from app.telemetry.metrics import Metrics
from app.telemetry.record import RequestRecord
from app.telemetry.usage import UsageLedger

UNKNOWN_MODEL = "_unknown"

log = logging.getLogger("arbiter.telemetry")


class Observer:
    LATEST = 0.005  # seconds a finished request's bookkeeping waits at most, in a process with no new request

    def __init__(self, metrics: Metrics, ledger: UsageLedger, *, log_payloads: bool,
                 is_known: Callable[[str], bool] = lambda _name: True,
                 alias_target: Callable[[str], str | None] = lambda _name: None, traced: bool = False) -> None:
        self.metrics = metrics
        self.ledger = ledger
        self.log_payloads = log_payloads
        self._traced = traced
        # ARBITER_USAGE_DURABLE=always: a request's record is fsynced before its answer (``commit``).
        journal = getattr(ledger, "journal", None)  # a stand-in ledger (tests) may have none
        self.durable = journal is not None and journal.journaling and journal.always
        self._is_known = is_known
        self._alias_target = alias_target
        self._pending: list[tuple[RequestRecord, Any]] = []
        # The loop a timer, or a call_soon, is waiting in (not just a flag: a loop that closed with
        # one waiting never runs it, and the next loop must not take it as armed).
        self._timer_in: asyncio.AbstractEventLoop | None = None
        self._soon_in: asyncio.AbstractEventLoop | None = None

    def finish(self, record: RequestRecord, body: Any = None) -> None:
        """A request is answered: its record is kept for the bookkeeping, which runs later."""
        if record.at is None:
            record.at = dt.datetime.now(dt.UTC)  # when it ended, not when its bookkeeping ran
        if self._traced:  # the request's span, for its access line: the bookkeeping runs outside it
            record.trace_ids = current_trace_ids()
        state = body.get("state") if self.log_payloads and isinstance(body, dict) else None
        self._pending.append((record, state))
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop (a tool, a unit test): nothing to wait for
            self.drain()
            return
        if self._timer_in is not loop:
            self._timer_in = loop
            # In a context of its own: not the request's that happened to arm it, whose id its
            # log lines would otherwise carry.
            loop.call_later(self.LATEST, self._on_timer, loop, context=contextvars.Context())

    async def commit(self, record: RequestRecord, body: Any = None) -> None:
        """``finish``, the bookkeeping at once, and the wait for the record's fsync in the spool."""
        self.finish(record, body)
        self.drain()
        await self.ledger.durable()

    def soon(self) -> None:
        """A request has arrived: the bookkeeping left waiting runs once its task first waits."""
        if self._pending:
            loop = asyncio.get_running_loop()
            if self._soon_in is not loop:
                self._soon_in = loop
                loop.call_soon(self._drain_soon, loop, context=contextvars.Context())

    def drain(self) -> None:
        """The bookkeeping of every request finished so far, now."""
        pending, self._pending = self._pending, []
        for record, state in pending:
            try:
                self._book(record, state)
            except Exception:  # one record's fault: the others still count
                log.exception("the bookkeeping of request %s failed", record.request_id,
                              extra={"request_id": record.request_id})

    def _drain_soon(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._soon_in is loop:
            self._soon_in = None
        self.drain()

    def _on_timer(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer_in is loop:
            self._timer_in = None
        self.drain()

    def _book(self, record: RequestRecord, state: Any) -> None:
        # A request through an alias counts for its target, the alias beside it (only an alias an
        # admin made: the label values stay few).
        target = self._alias_target(record.model) if record.model is not None else None
        if target is not None:
            record.alias, record.model = record.model, target
        # A name the caller made up (a 403 or 404) never becomes a metric label or a ledger
        # value: tenants must not choose label values or row contents of any length.
        if record.model is not None and not self._is_known(record.model):
            record.model = UNKNOWN_MODEL
        self.metrics.observe(record)
        self.ledger.add(record)
        log_request(record, state)
