"""``arbiter usage rollup``: rows written by another tool (no rollups) are counted, a re-run counts
nothing twice, and the command refuses the remote options (it has no admin API)."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import MetaData, insert, select

from app.db.models import UsageRecord, UsageRollup
from app.telemetry import usage
from tests.cli.conftest import Run
from tests.support import Stack

LEGACY = UsageRecord.__table__.to_metadata(MetaData(), name="usage_records")  # before 0018


def imported(stack: Stack, days_ago: int, n: int) -> None:
    """``n`` records ``days_ago`` days back, written as a bulk import would: no ORM, no ledger."""
    at = dt.datetime.now(dt.UTC).replace(hour=6, minute=0) - dt.timedelta(days=days_ago)
    with stack.db.engine.begin() as connection:
        connection.execute(insert(UsageRecord), [
            {"at": at, "request_id": f"imp{days_ago}-{i}", "project_id": 1, "key_id": None, "operation": "decision",
             "model": "nimble", "provider": "ollama", "status": 200 if i % 2 else 500, "input_tokens": 3,
             "output_tokens": 1, "latency_ms": 4.0, "record_uid": None, "alias": None} for i in range(n)])


def counted(stack: Stack) -> list[tuple[str, int, int]]:
    with stack.db.session() as s:
        return [(r["day"], r["requests"], r["errors"]) for r in usage.summary(s)]


def test_the_rollups_of_imported_rows_are_counted_once(cli: Run, stack: Stack) -> None:
    imported(stack, 10, 4)
    imported(stack, 2, 6)
    assert counted(stack) == []  # imported behind the ledger's back
    since = (dt.datetime.now(dt.UTC).date() - dt.timedelta(days=3)).isoformat()
    result = cli("local", "usage", "rollup", "--since", since)
    assert result.code == 0 and "4 day(s)" in result.out, result
    assert [c[1:] for c in counted(stack)] == [(6, 3)]  # the older day is left as it was
    for _ in range(2):  # everything, twice: the same totals
        assert cli("local", "usage", "rollup").code == 0
    assert [c[1:] for c in counted(stack)] == [(4, 2), (6, 3)]
    with stack.db.session() as s:  # both days are before yesterday: by the day (one row per key, at 00:00)
        assert {h.hour for h in s.scalars(select(UsageRollup.hour))} == {0}
        assert len(s.scalars(select(UsageRollup)).all()) == 4  # two days, two statuses


def test_a_bad_day_and_the_remote_options_are_refused(cli: Run) -> None:
    assert "is not a day" in cli("local", "usage", "rollup", "--since", "yesterday").err
    assert cli("local", "usage", "rollup", "--since", "2999-01-01").error_line("is after today")
    assert cli("local", "--url", "http://127.0.0.1:9", "usage", "rollup").error_line("runs here, on this machine")


def test_the_previous_releases_rows_are_moved_into_the_ledger_and_counted(cli: Run, stack: Stack) -> None:
    """PostgreSQL after 0018: the previous release wrote into usage_records while it ran."""
    if stack.db.engine.dialect.name != "postgresql":
        return  # SQLite renames the table: nothing is left behind
    at = dt.datetime.now(dt.UTC).replace(hour=6, minute=0) - dt.timedelta(days=1)
    with stack.db.engine.begin() as connection:
        connection.execute(insert(LEGACY), [
            {"at": at, "request_id": f"old-{i}", "project_id": 1, "key_id": None, "operation": "decision",
             "model": "nimble", "provider": "ollama", "status": 200, "input_tokens": 3, "output_tokens": 1,
             "latency_ms": 4.0, "record_uid": f"{i:032x}", "alias": None} for i in range(3)])
    result = cli("local", "usage", "rollup")
    assert result.code == 0 and "3 usage records of the previous release moved" in result.out, result
    assert [c[1:] for c in counted(stack)] == [(3, 0)]
