"""A finished request's bookkeeping (metrics, usage, access line) runs after its answer, in the
wait of the next request, or on a timer; never lost, never out of order."""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime as dt
import json
import logging
from typing import Any

import pytest
from prometheus_client import generate_latest
from sqlalchemy import select

from app.db.models import Project, UsageRecord
from app.telemetry import logs
from app.telemetry.logs import JsonFormatter, log_request
from app.telemetry.metrics import Metrics
from app.telemetry.observer import Observer
from app.telemetry.record import RequestRecord
from tests.support import Stack, decision, run_async
from tests.telemetry.test_metrics import samples


class Ledger:
    """Stands in for the usage ledger: what was added, in order, and when each request ended."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.added: list[str] = []
        self.ended: list[dt.datetime | None] = []
        self.fail_on = fail_on

    def add(self, record: RequestRecord) -> None:
        if record.request_id == self.fail_on:
            raise RuntimeError("a broken record")
        logging.getLogger("arbiter.test-ledger").warning("adding %s", record.request_id)
        self.added.append(record.request_id)
        self.ended.append(record.at)


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

    run_async(scenario())
    assert seen == [[], ["first", "second"]]


def test_with_no_next_request_a_timer_books_them() -> None:
    ledger = Ledger()

    async def scenario() -> list[str]:
        watcher = observer(ledger)
        watcher.finish(record("alone"))
        await asyncio.sleep(Observer.LATEST + 0.05)
        return list(ledger.added)

    assert run_async(scenario()) == ["alone"]


def test_without_an_event_loop_it_books_at_once() -> None:
    ledger = Ledger()
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:  # a thread with no loop running
        pool.submit(observer(ledger).finish, record("now")).result()
    assert ledger.added == ["now"]


def test_one_broken_record_does_not_cost_the_others(caplog: pytest.LogCaptureFixture) -> None:
    ledger = Ledger(fail_on="broken")
    watcher = observer(ledger)

    async def scenario() -> None:
        for request_id in ("a", "broken", "b"):
            watcher.finish(record(request_id))
        watcher.drain()

    with caplog.at_level(logging.ERROR, "arbiter.telemetry"):
        run_async(scenario())
    assert ledger.added == ["a", "b"]
    assert "the bookkeeping of request broken failed" in caplog.text


def test_the_end_time_is_when_the_request_ended_not_when_it_was_booked() -> None:
    ledger = Ledger()

    async def scenario() -> dt.datetime:
        watcher = observer(ledger)
        watcher.finish(record("timed"))
        await asyncio.sleep(0.05)
        booked = dt.datetime.now(dt.UTC)
        watcher.drain()
        return booked

    booked = run_async(scenario())
    ended = ledger.ended[0]
    assert ended is not None and dt.timedelta(seconds=0.04) < booked - ended < dt.timedelta(seconds=5)


def test_an_access_line_written_later_keeps_the_time_its_request_ended(caplog: pytest.LogCaptureFixture) -> None:
    finished = record("late")
    finished.at = dt.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=dt.UTC)
    with caplog.at_level(logging.INFO, "arbiter.access"):
        log_request(finished)
    line = next(r for r in caplog.records if r.name == "arbiter.access")
    assert json.loads(JsonFormatter().format(line))["time"] == "2026-01-02T03:04:05.678+00:00"


def test_lines_logged_while_booking_do_not_carry_the_id_of_the_request_that_armed_the_timer() -> None:
    ledger = Ledger()
    lines: list[dict[str, Any]] = []

    class Collect(logging.Handler):
        def emit(self, line: logging.LogRecord) -> None:
            lines.append(json.loads(JsonFormatter().format(line)))

    handler = Collect()
    logging.getLogger("arbiter.test-ledger").addHandler(handler)

    async def scenario() -> None:
        watcher = observer(ledger)

        async def a_request() -> None:  # its task's context holds its request id, as the middleware sets it
            logs.request_id.set("the-arming-request")
            watcher.finish(record("booked"))

        await asyncio.create_task(a_request())
        await asyncio.sleep(Observer.LATEST + 0.05)

    try:
        run_async(scenario())
    finally:
        logging.getLogger("arbiter.test-ledger").removeHandler(handler)
    assert ledger.added == ["booked"]
    assert [line.get("request_id") for line in lines] == [None]


def test_a_new_event_loop_gets_a_timer_of_its_own() -> None:
    ledger = Ledger()
    watcher = observer(ledger)

    async def finish(request_id: str, wait: float) -> None:
        watcher.finish(record(request_id))
        await asyncio.sleep(wait)

    run_async(finish("a", 0))  # its loop closes with the timer still waiting: that timer never runs
    assert ledger.added == []
    run_async(finish("b", Observer.LATEST + 0.05))
    assert ledger.added == ["a", "b"]


@pytest.fixture
def slow_bookkeeping(monkeypatch: pytest.MonkeyPatch) -> None:
    """No timer in the test's time: only a scrape, a next request or the shutdown books."""
    monkeypatch.setattr(Observer, "LATEST", 600.0)


def durations(text: str) -> float:
    return sum(value for (name, labels), value in samples(text).items()
               if name == "gen_ai_client_operation_duration_seconds_count"
               and ("gen_ai_request_model", "nimble") in labels)


def test_each_request_books_the_one_before_it(slow_bookkeeping: Any, stack: Stack) -> None:
    metrics = stack.gateway.app.components.metrics
    booked = []
    with stack.client() as client:
        for _ in range(3):
            assert client.post("/v1/systemone", json=decision()).status_code == 200
            booked.append(durations(generate_latest(metrics.registry).decode()))  # read here: no scrape drains
    assert booked == [0, 1, 2]  # the last one waits for the next request (or the timer)


def test_a_scrape_counts_every_request_answered_before_it(slow_bookkeeping: Any, stack: Stack,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    with stack.client() as client:
        for _ in range(3):
            assert client.post("/v1/systemone", json=decision()).status_code == 200
    monkeypatch.setattr(Observer, "soon", lambda self: None)  # only the scrape's own drain books them
    with stack.client("admin") as admin:
        response = admin.get("/metrics")
    assert response.status_code == 200
    assert durations(response.text) == 3


def test_the_shutdown_books_the_last_requests_before_the_ledger_writes(slow_bookkeeping: Any, stack: Stack) -> None:
    with stack.client() as client:
        ids = [client.post("/v1/systemone", json=decision()).headers["x-request-id"] for _ in range(2)]
    stack.gateway.stop()
    with stack.db.session() as session:
        written = list(session.scalars(select(UsageRecord.request_id).order_by(UsageRecord.id)))
    assert written == ids


def test_a_request_that_ends_during_the_shutdown_is_still_written(slow_bookkeeping: Any, stack: Stack,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """uvicorn cancels what is still running at its graceful timeout and shuts down at once: such
    a request's cleanup can finish it while the shutdown's first steps run."""
    components = stack.gateway.app.components
    with stack.db.session() as session:
        project_id = session.scalar(select(Project.id).where(Project.name == "acme"))
    flush_touches = components.touches.flush

    async def touches_then_a_late_request() -> None:
        late = record("late-one")
        late.project_id, late.key_id = project_id, None
        components.observer.finish(late)
        await flush_touches()

    monkeypatch.setattr(components.touches, "flush", touches_then_a_late_request)
    stack.gateway.stop()
    with stack.db.session() as session:
        assert list(session.scalars(select(UsageRecord.request_id))) == ["late-one"]
