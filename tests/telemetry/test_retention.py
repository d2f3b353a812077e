"""The usage ledger's table (0018) and its maintenance (app/telemetry/retention.py): day partitions
ahead, retention that drops a day whole (PostgreSQL) or deletes old rows (SQLite) and keeps the
rollups, and the previous release's rows moved into the ledger once, ids kept."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest
from sqlalchemy import func, select, text

from app.db import lease
from app.db.models import UsageRollup
from app.db.session import Database
from app.telemetry import retention
from app.telemetry.record import RequestRecord
from app.telemetry.retention import Outcome, UsageMaintenance
from app.telemetry.usage import UsageLedger, _with_uids
from app.telemetry.usage_report import Period
from app.telemetry.usage_requests import Filters, page, with_request_id
from tests.support import Stack

NOW = dt.datetime.now(dt.UTC)


@pytest.fixture
def db(db: Database) -> Database:
    """The test database with a project the records belong to, and no rows of a previous release."""
    Stack.provision(db)
    if db.engine.dialect.name == "postgresql":  # the day partitions a migration makes today, and no others
        window = {NOW.date() + dt.timedelta(days=n) for n in range(-1, 8)}
        with db.engine.begin() as connection:
            connection.exec_driver_sql("TRUNCATE usage_records")
            for day, name in retention.day_partitions(db.engine).items():
                if day not in window:
                    connection.exec_driver_sql(f"DROP TABLE {name}")
        retention.ensure_partitions(db.engine, NOW.date(), Outcome())
    return db


def postgresql(db: Database) -> bool:
    return db.engine.dialect.name == "postgresql"


def record(i: int, at: dt.datetime) -> RequestRecord:
    return RequestRecord(request_id=f"r{i}", operation="decision", route="/v1/systemone", model="nimble",
                         project_id=1, status=200, input_tokens=10, output_tokens=1, at=at)


def write(db: Database, *ats: dt.datetime) -> None:
    ledger = UsageLedger(db)
    for i, at in enumerate(ats):
        ledger.add(record(i, at))
    asyncio.run(ledger.flush())


def count(db: Database, sql: str) -> int:
    with db.engine.connect() as connection:
        return int(connection.execute(text(sql)).scalar() or 0)


def requests_rolled_up(db: Database) -> int:
    with db.session() as session:
        return int(session.scalar(select(func.sum(UsageRollup.requests))) or 0)


def maintain(db: Database, now: dt.datetime = NOW, days: int = 90, rollup_days: int = 730) -> Outcome:
    job = UsageMaintenance(db, interval=3600, retention_days=days, rollup_retention_days=rollup_days,
                           clock=lambda: now)
    return asyncio.run(job.run_once())


def test_the_ledger_writes_usage_ledger_and_a_replayed_batch_across_two_days_is_stored_once(db: Database) -> None:
    midnight = dt.datetime.combine(NOW.date(), dt.time(), dt.UTC)
    ledger = UsageLedger(db)
    for i, at in enumerate([midnight - dt.timedelta(seconds=1), midnight, midnight + dt.timedelta(hours=1)]):
        ledger.add(record(i, at))
    batch = ledger._pending  # the rows as the writer takes them, uids added below
    rows = _with_uids(batch)
    ledger._write(rows)
    ledger._write(rows)  # the same batch again: its first COMMIT landed, the answer lost
    assert count(db, "SELECT count(*) FROM usage_ledger") == 3
    assert requests_rolled_up(db) == 3  # counted once too
    if postgresql(db):  # in two day partitions
        assert count(db, f"SELECT count(*) FROM usage_ledger_p{(NOW.date() - dt.timedelta(days=1)):%Y%m%d}") == 1
        assert count(db, f"SELECT count(*) FROM usage_ledger_p{NOW.date():%Y%m%d}") == 2


def test_retention_takes_the_records_past_it_and_keeps_their_rollups(db: Database) -> None:
    old, recent = NOW - dt.timedelta(days=91), NOW - dt.timedelta(days=89)
    write(db, old, old, recent)
    assert maintain(db).deleted == 2  # the DEFAULT partition's on PostgreSQL (no day partition that old)
    assert count(db, "SELECT count(*) FROM usage_ledger") == 1
    assert requests_rolled_up(db) == 3


def test_nothing_goes_with_retention_zero(db: Database) -> None:
    write(db, NOW - dt.timedelta(days=3000))
    maintain(db, days=0, rollup_days=0)
    assert count(db, "SELECT count(*) FROM usage_ledger") == 1
    assert requests_rolled_up(db) == 1


def test_rollups_past_their_retention_go_a_day_at_a_time(db: Database) -> None:
    write(db, NOW - dt.timedelta(days=800), NOW - dt.timedelta(days=740), NOW - dt.timedelta(days=700))
    outcome = maintain(db, days=0)
    assert outcome.rollups_deleted == 4  # two hours' totals and latencies
    assert requests_rolled_up(db) == 1
    assert count(db, "SELECT count(*) FROM usage_latency_rollups") == 1


def rollup_hours(db: Database) -> list[dt.datetime]:
    with db.session() as session:
        return sorted(h if h.tzinfo is not None else h.replace(tzinfo=dt.UTC)
                      for h in session.scalars(select(UsageRollup.hour)))


def test_the_days_before_yesterday_are_merged_into_their_first_hour(db: Database) -> None:
    now = dt.datetime.combine(NOW.date(), dt.time(12), dt.UTC)
    old = now - dt.timedelta(days=5)
    write(db, old - dt.timedelta(hours=6), old, old + dt.timedelta(hours=3), now - dt.timedelta(days=1), now)
    assert len(rollup_hours(db)) == 5
    outcome = maintain(db, now=now)
    assert outcome.days_merged == 1 and not outcome.failed
    midnight = dt.datetime.combine(old.date(), dt.time(), dt.UTC)
    assert rollup_hours(db) == [midnight, now - dt.timedelta(days=1), now]  # yesterday and today by the hour
    assert requests_rolled_up(db) == 5
    assert count(db, "SELECT count(*) FROM usage_latency_rollups") == 3
    assert maintain(db, now=now).days_merged == 0


def test_a_day_of_rollups_goes_once_all_of_it_is_past_their_retention(db: Database) -> None:
    now = dt.datetime.combine(NOW.date(), dt.time(12), dt.UTC)
    first = dt.datetime.combine((now - dt.timedelta(days=730)).date(), dt.time(), dt.UTC)
    write(db, first + dt.timedelta(minutes=1), first - dt.timedelta(minutes=1))  # merged into its 00:00
    outcome = maintain(db, now=now, days=0)
    assert outcome.rollups_deleted == 2  # the day before's (totals and latencies); the half-past day kept whole
    assert rollup_hours(db) == [first]
    assert maintain(db, now=now + dt.timedelta(days=1), days=0).rollups_deleted == 2


def test_sqlite_deletes_old_rows_in_batches(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    if postgresql(db):
        pytest.skip("SQLite's retention")
    monkeypatch.setattr(retention, "DELETE_BATCH", 2)
    write(db, *[NOW - dt.timedelta(days=100, minutes=i) for i in range(5)], NOW)
    outcome = Outcome()
    retention.delete_old_rows(db.engine, NOW - dt.timedelta(days=90), outcome, batch=2)
    assert outcome.deleted == 5
    assert count(db, "SELECT count(*) FROM usage_ledger") == 1


# PostgreSQL: the partitions.

def partitions(db: Database) -> set[dt.date]:
    return set(retention.day_partitions(db.engine))


def test_a_run_makes_the_partitions_ahead_and_drops_a_day_past_the_retention(db: Database) -> None:
    if not postgresql(db):
        pytest.skip("PostgreSQL's partitions")
    today = NOW.date()
    write(db, NOW)  # in today's partition
    later = NOW + dt.timedelta(days=91)  # today is past the retention then
    outcome = maintain(db, now=later)
    wanted = {later.date() + dt.timedelta(days=n) for n in range(-1, 8)}
    assert wanted <= partitions(db)
    assert today not in partitions(db) and f"usage_ledger_p{today:%Y%m%d}" in outcome.dropped
    assert count(db, "SELECT count(*) FROM usage_ledger") == 0
    assert requests_rolled_up(db) == 1  # the reports still count it
    assert outcome.partitions == len(partitions(db))
    again = maintain(db, now=later)  # nothing more to make or drop
    assert (again.created, again.dropped, again.failed) == ([], [], [])


def test_a_day_made_late_takes_its_rows_out_of_the_default_partition(db: Database) -> None:
    if not postgresql(db):
        pytest.skip("PostgreSQL's partitions")
    ahead = NOW.date() + dt.timedelta(days=5)
    with db.engine.begin() as connection:
        connection.exec_driver_sql(f"DROP TABLE usage_ledger_p{ahead:%Y%m%d}")
    at = dt.datetime.combine(ahead, dt.time(12), dt.UTC)
    write(db, at, at + dt.timedelta(minutes=1))
    assert count(db, "SELECT count(*) FROM usage_ledger_default") == 2
    outcome = maintain(db)
    assert outcome.created == [f"usage_ledger_p{ahead:%Y%m%d}"] and not outcome.failed
    assert count(db, "SELECT count(*) FROM usage_ledger_default") == 0
    assert count(db, f"SELECT count(*) FROM usage_ledger_p{ahead:%Y%m%d}") == 2
    write(db, at)  # the same uid? no: a new batch, a new row, into the new partition
    assert count(db, f"SELECT count(*) FROM usage_ledger_p{ahead:%Y%m%d}") == 3


def legacy_insert(db: Database, *rows: tuple[int, dt.datetime, str]) -> None:
    """As the previous release writes: by SQL, into usage_records, ON CONFLICT (record_uid)."""
    with db.engine.begin() as connection:
        for i, at, uid in rows:
            connection.execute(text(
                "INSERT INTO usage_records (at, request_id, project_id, key_id, operation, model, provider, status, "
                "input_tokens, output_tokens, latency_ms, alias, record_uid) VALUES (:at, :rid, 1, NULL, 'decision', "
                "'nimble', 'ollama', 200, 4, 2, 1.5, NULL, :uid) ON CONFLICT (record_uid) DO NOTHING"),
                {"at": at, "rid": f"legacy-{i}", "uid": uid})


def test_the_previous_releases_rows_are_moved_once_ids_kept_and_found_by_the_request_pages(
        db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    if not postgresql(db):
        pytest.skip("the previous release's table is renamed on SQLite")
    monkeypatch.setattr(retention, "LEGACY_BATCH", 2)  # several batches
    monkeypatch.setattr(retention, "LEGACY_PAUSE", 0.0)
    legacy_insert(db, *[(i, NOW - dt.timedelta(minutes=i), f"{i:032x}") for i in range(5)])
    with db.engine.connect() as connection:
        ids = sorted(connection.execute(text("SELECT id FROM usage_records")).scalars())
    write(db, NOW)  # the new release's row meanwhile: its id from the same sequence
    outcome = maintain(db)
    assert outcome.moved == 5 and not outcome.failed
    assert count(db, "SELECT count(*) FROM usage_records") == 0
    with db.engine.connect() as connection:
        moved = sorted(connection.execute(text(
            "SELECT id FROM usage_ledger WHERE request_id LIKE 'legacy-%'")).scalars())
    assert moved == ids
    assert count(db, "SELECT count(DISTINCT id) FROM usage_ledger") == 6
    assert maintain(db).moved == 0  # once
    period = Period(NOW - dt.timedelta(days=1), NOW + dt.timedelta(minutes=1), hourly=True)
    with db.session() as session:
        listed = page(session, Filters(), period)
        found = with_request_id(session, "legacy-3")
    assert len(listed) == 6 and {row["request_id"] for row in listed} >= {f"legacy-{i}" for i in range(5)}
    assert len(found) == 1


def test_a_legacy_row_already_in_the_ledger_is_not_added_twice(db: Database) -> None:
    if not postgresql(db):
        pytest.skip("the previous release's table is renamed on SQLite")
    legacy_insert(db, (0, NOW, "a" * 32))
    with db.engine.begin() as connection:  # as if a move's answer was lost after its COMMIT: copied already
        connection.exec_driver_sql(f"INSERT INTO usage_ledger ({retention.COLUMNS}) "
                                   f"SELECT {retention.COLUMNS} FROM usage_records")
    assert retention.move_legacy_batch(db.engine) == 1
    assert count(db, "SELECT count(*) FROM usage_ledger") == 1
    assert count(db, "SELECT count(*) FROM usage_records") == 0


def test_a_failing_step_is_logged_and_the_others_still_run(db: Database, monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    def broken(*_: Any) -> None:
        raise RuntimeError("the partitions step broke")

    monkeypatch.setattr(retention, "ensure_partitions", broken)
    monkeypatch.setattr(retention, "drop_old_partitions", broken)
    write(db, NOW - dt.timedelta(days=100))
    with caplog.at_level("WARNING", "arbiter.usage"):
        outcome = maintain(db)
    assert outcome.deleted == 1  # the batched delete ran all the same
    assert count(db, "SELECT count(*) FROM usage_ledger") == 0
    if postgresql(db):
        assert outcome.failed == ["partitions", "retention"]
        assert "the partitions step broke" in caplog.text


def test_only_the_lease_holder_runs_it(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    assert lease.try_hold(db, retention.LEASE, 600, holder="another replica")
    write(db, NOW - dt.timedelta(days=100))
    job = UsageMaintenance(db, interval=0.05, retention_days=90, rollup_retention_days=730)
    answers: list[bool] = []
    hold = lease.try_hold

    def counted(*args: Any, **kwargs: Any) -> bool:
        answers.append(hold(*args, **kwargs))
        return answers[-1]

    monkeypatch.setattr(retention.lease, "try_hold", counted)

    async def until(done: Any) -> None:
        for _ in range(600):  # a bound, not a timing: a hung job fails instead of hanging the suite
            if done():
                return
            await asyncio.sleep(0.05)
        raise AssertionError("never")

    async def turns() -> None:
        task = asyncio.create_task(job.run(first_after=0))
        try:
            await until(lambda: len(answers) >= 2)
            assert job.runs == 0 and not any(answers)  # another replica holds it: nothing ran here
            assert count(db, "SELECT count(*) FROM usage_ledger") == 1
            await asyncio.to_thread(lease.release, db, retention.LEASE, "another replica")
            await until(lambda: job.runs >= 1)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(turns())
    assert count(db, "SELECT count(*) FROM usage_ledger") == 0
