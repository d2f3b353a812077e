"""The usage ledger's writer: a bad row, a database that goes away, and what is dropped is counted."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError

from app.db.models import UsageRecord
from app.db.session import Database
from app.telemetry.record import RequestRecord
from app.telemetry.usage import UsageLedger
from tests.support import Stack


@pytest.fixture
def db(db: Database) -> Database:
    """The test database with a project the records belong to."""
    Stack.provision(db)
    return db


def record(i: int, tokens: int = 10) -> RequestRecord:
    return RequestRecord(request_id=f"r{i}", operation="decision", route="/v1/systemone", model="nimble",
                         project_id=1, status=200, input_tokens=tokens, output_tokens=1)


def rows(db: Database) -> int:
    with db.session() as session:
        return int(session.scalar(select(func.count()).select_from(UsageRecord)) or 0)


def test_one_unstorable_row_is_dropped_and_counted_the_rest_written(db: Database) -> None:
    """sqlite3 raises OverflowError (no DataError) for 2**63: it must not stop the ledger."""
    counted: list[int] = []
    ledger = UsageLedger(db, on_dropped=counted.append)
    ledger.add(record(0, tokens=2**63))
    for i in range(1, 20):
        ledger.add(record(i))
    asyncio.run(ledger.flush())
    assert (rows(db), ledger.pending, ledger.dropped, sum(counted)) == (19, 0, 1, 1)


def test_dropped_records_are_logged_at_most_once_a_minute(db: Database, caplog: pytest.LogCaptureFixture) -> None:
    ledger = UsageLedger(db)
    for i in range(5):
        ledger.add(record(i, tokens=2**64))
    with caplog.at_level(logging.ERROR, "arbiter.usage"):
        asyncio.run(ledger.flush())
    assert ledger.dropped == 5
    assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) == 1


def test_the_database_going_away_row_by_row_keeps_the_rest_and_the_writer_lives(
        db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = UsageLedger(db)
    ledger.add(record(0, tokens=2**63))
    for i in range(1, 10):
        ledger.add(record(i))
    write = ledger._write
    calls = [0]

    def failing(batch: list[tuple[Any, ...]]) -> None:
        calls[0] += 1
        if calls[0] == 5:  # 1: the batch, 2: the bad row, 3-4: written, 5: the connection drops
            raise OperationalError("INSERT", {}, Exception("server closed the connection unexpectedly"))
        write(batch)

    monkeypatch.setattr(ledger, "_write", failing)

    async def scenario() -> bool:
        task = asyncio.create_task(ledger.run(0.05))
        await asyncio.sleep(0.02)
        await ledger.flush()
        assert (rows(db), ledger.pending, ledger.dropped) == (2, 7, 1)
        deadline = time.monotonic() + 10
        while (ledger.pending or rows(db) < 9) and not task.done():  # the timer writes the rest
            assert time.monotonic() < deadline, (rows(db), ledger.pending)
            await asyncio.sleep(0.02)
        alive = not task.done()
        task.cancel()
        return alive

    assert asyncio.run(scenario())
    assert (rows(db), ledger.pending, ledger.dropped) == (9, 0, 1)


def test_the_writer_survives_an_unexpected_failure(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = UsageLedger(db)

    async def broken() -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(ledger, "flush", broken)

    async def scenario() -> bool:
        task = asyncio.create_task(ledger.run(0.01))
        await asyncio.sleep(0.1)
        alive = not task.done()
        task.cancel()
        return alive

    assert asyncio.run(scenario())


def test_a_batch_whose_commit_landed_but_whose_answer_was_lost_is_not_written_twice(
        db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = UsageLedger(db)
    for i in range(200):  # more than one INSERT statement's worth
        ledger.add(record(i))
    write = ledger._write
    lost = [True]

    def commit_then_lose_the_answer(batch: list[tuple[Any, ...]]) -> None:
        write(batch)
        if lost.pop() if lost else False:
            raise OperationalError("COMMIT", {}, Exception("server closed the connection unexpectedly"))

    monkeypatch.setattr(ledger, "_write", commit_then_lose_the_answer)
    asyncio.run(ledger.flush())
    assert (rows(db), ledger.pending) == (200, 200)  # written, but the ledger cannot know
    asyncio.run(ledger.flush())
    with db.session() as session:
        ids = list(session.scalars(select(UsageRecord.request_id)))
        uids = set(session.scalars(select(UsageRecord.record_uid)))
    assert (len(ids), len(set(ids)), ledger.pending) == (200, 200, 0)
    assert len(uids) == 200 and all(uid and len(uid) == 32 for uid in uids)


def away(batch: list[tuple[Any, ...]]) -> None:
    raise OperationalError("INSERT", {}, Exception("connection refused"))


def test_a_shutdown_with_the_database_away_keeps_the_records_for_the_next_start(
        db: Database, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = UsageLedger(db, spool_dir=tmp_path)
    for i in range(10):
        ledger.add(record(i))
    monkeypatch.setattr(ledger, "_write", away)
    asyncio.run(ledger.close(retry_for=0.2))
    assert (ledger.pending, ledger.dropped, rows(db)) == (0, 0, 0)
    assert len(list(tmp_path.glob("arbiter-usage-spool-*.journal"))) == 1

    again = UsageLedger(db, spool_dir=tmp_path)  # the next start
    assert again.load_spool() == 10
    assert again.load_spool() == 0  # claimed: kept until written, never loaded twice
    asyncio.run(again.flush())
    asyncio.run(again.close())
    assert rows(db) == 10 and list(tmp_path.iterdir()) == []
    with db.session() as session:
        written = list(session.scalars(select(UsageRecord).order_by(UsageRecord.id)))
    assert [r.request_id for r in written] == [f"r{i}" for i in range(10)]
    assert all(r.at.year >= 2026 and r.record_uid for r in written)


def test_a_shutdown_that_cannot_spool_either_counts_and_logs_what_is_lost(
        db: Database, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "file").write_text("")
    counted: list[int] = []
    ledger = UsageLedger(db, on_dropped=counted.append, spool_dir=tmp_path / "file")  # no directory
    for i in range(7):
        ledger.add(record(i))
    monkeypatch.setattr(ledger, "_write", away)
    with caplog.at_level(logging.ERROR, "arbiter.usage"):
        asyncio.run(ledger.close(retry_for=0.0))
    assert (ledger.pending, ledger.dropped, sum(counted)) == (0, 7, 7)
    assert any("7 usage records are lost" in r.getMessage() for r in caplog.records)


def test_a_shutdown_retries_a_database_that_comes_back(db: Database, monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Any) -> None:
    ledger = UsageLedger(db, spool_dir=tmp_path)
    for i in range(3):
        ledger.add(record(i))
    write, failures = ledger._write, [1, 1]

    def back_after_two(batch: list[tuple[Any, ...]]) -> None:
        if failures:
            failures.pop()
            away(batch)
        write(batch)

    monkeypatch.setattr(ledger, "_write", back_after_two)
    asyncio.run(ledger.close(retry_for=3.0))
    assert (rows(db), ledger.pending, list(tmp_path.iterdir())) == (3, 0, [])


def test_a_spool_from_before_the_alias_column_is_written_with_no_alias(db: Database, tmp_path: Any) -> None:
    """A release from before migration 0011 spooled rows without ``alias``: the next start (this
    release) writes them all the same."""
    spool = tmp_path / "arbiter-usage-spool-1-old.jsonl"
    spool.write_text('["2026-12-01T10:00:00+00:00", "old", null, null, "decision", "nimble", "ollama", 200, '
                     '3, 1, 2.5, "0123456789abcdef01234567"]\n', encoding="utf-8")
    ledger = UsageLedger(db, spool_dir=tmp_path)
    aliased = record(1)
    aliased.model, aliased.alias = "nimble", "jev-latest"
    ledger.add(aliased)
    assert ledger.load_spool() == 1
    asyncio.run(ledger.flush())
    with db.session() as session:
        written = {r.request_id: (r.model, r.alias) for r in session.scalars(select(UsageRecord))}
    assert written == {"old": ("nimble", None), "r1": ("nimble", "jev-latest")}
