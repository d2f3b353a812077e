"""A finished request's bookkeeping (metrics, usage, access line) runs after its answer, in the
wait of the next request, or on a timer; never lost, never out of order."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from sqlalchemy import select

from app.db.models import UsageRecord
from app.telemetry.metrics import Metrics
from app.telemetry.observer import Observer
from app.telemetry.record import RequestRecord
from tests.support import Stack, decision
from tests.telemetry.test_metrics import scrape


class Ledger:
    """Stands in for the usage ledger: what was added, in order."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.added: list[str] = []
        self.fail_on = fail_on

    def add(self, record: RequestRecord) -> None:
        if record.request_id == self.fail_on:
            raise RuntimeError("a broken record")
        self.added.append(record.request_id)


def record(request_id: str) -> RequestRecord:
    return RequestRecord(request_id, "decision", "/v1/systemone", model="nimble", project_id=1, key_id=1,
                         provider="ollama", status=200, seconds=0.001)


def observer(ledger: Ledger) -> Observer:
    return Observer(Metrics(), ledger, log_payloads=False)  # type: ignore[arg-type]


def test_the_next_request_books_the_last_one_once_it_first_waits() -> None:
    ledger = Ledger()
    seen: list[list[str]] = []

    async def scenario() -> None:
        watcher = observer(ledger)
        watcher.finish(record("first"))
        watcher.finish(record("second"))
        assert ledger.added == []  # answered, not booked yet

        async def next_request() -> None:
            watcher.soon()  # as the app does when a request arrives
            seen.append(list(ledger.added))  # its own work up to the backend call: nothing booked in it
            await asyncio.sleep(0)  # it waits (on its backend)
            seen.append(list(ledger.added))

        await next_request()

    asyncio.run(scenario())
    assert seen == [[], ["first", "second"]]


def test_with_no_next_request_a_timer_books_them() -> None:
    ledger = Ledger()

    async def scenario() -> list[str]:
        watcher = observer(ledger)
        watcher.finish(record("alone"))
        await asyncio.sleep(Observer.LATEST + 0.05)
        return list(ledger.added)

    assert asyncio.run(scenario()) == ["alone"]


def test_without_an_event_loop_it_books_at_once() -> None:
    ledger = Ledger()
    observer(ledger).finish(record("now"))
    assert ledger.added == ["now"]


def test_one_broken_record_does_not_cost_the_others(caplog: pytest.LogCaptureFixture) -> None:
    ledger = Ledger(fail_on="broken")
    watcher = observer(ledger)

    async def scenario() -> None:
        for request_id in ("a", "broken", "b"):
            watcher.finish(record(request_id))
        watcher.drain()

    with caplog.at_level(logging.ERROR, "arbiter.telemetry"):
        asyncio.run(scenario())
    assert ledger.added == ["a", "b"]
    assert "the bookkeeping of request broken failed" in caplog.text


def test_the_end_time_is_when_the_request_ended_not_when_it_was_booked() -> None:
    ledger = Ledger()
    finished = record("timed")

    async def scenario() -> None:
        watcher = observer(ledger)
        watcher.finish(finished)
        stamped = finished.at
        await asyncio.sleep(0.02)
        watcher.drain()
        assert finished.at is stamped

    asyncio.run(scenario())
    assert finished.at is not None


@pytest.fixture
def slow_bookkeeping(monkeypatch: pytest.MonkeyPatch) -> None:
    """No timer in the test's time: only a scrape, a next request or the shutdown books."""
    monkeypatch.setattr(Observer, "LATEST", 600.0)


def test_a_scrape_counts_every_request_answered_before_it(slow_bookkeeping: Any, stack: Stack) -> None:
    with stack.client() as client:
        for _ in range(3):
            assert client.post("/v1/systemone", json=decision()).status_code == 200
    found = scrape(stack)
    count = sum(value for (name, labels), value in found.items()
                if name == "gen_ai_client_operation_duration_seconds_count" and ("gen_ai_request_model", "nimble") in labels)
    assert count == 3


def test_the_shutdown_books_the_last_requests_before_the_ledger_writes(slow_bookkeeping: Any, stack: Stack) -> None:
    with stack.client() as client:
        ids = [client.post("/v1/systemone", json=decision()).headers["x-request-id"] for _ in range(2)]
    stack.gateway.stop()
    with stack.db.session() as session:
        written = list(session.scalars(select(UsageRecord.request_id).order_by(UsageRecord.id)))
    assert written == ids
