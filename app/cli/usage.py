"""``arbiter usage rollup [--since DAY]``: the usage rollups of a range of days counted again from
the raw records (after a bulk import, a restore, rows written by another tool, or the records a
previous release wrote while migration 0017 ran). Idempotent: each UTC day's rollups are deleted
and rebuilt in one transaction of its own (a day before yesterday merged back into one row per key
in it: the day level the maintenance keeps, app/db/rollups.py). It runs on this machine's database
only (the admin API has no endpoint for it): the remote options are refused."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from typing import Any

from app.errors import InvalidRequest
from app.settings import Settings


def add_parsers(sub: Any) -> None:
    usage = sub.add_parser("usage", help="usage ledger upkeep (on this machine's database)")
    commands = usage.add_subparsers(metavar="COMMAND")
    rollup = commands.add_parser("rollup", help="count the usage rollups again from the raw records")
    rollup.add_argument("--since", metavar="DAY", type=_day,
                        help="the first UTC day to count again, YYYY-MM-DD (default: the ledger's first day)")
    rollup.set_defaults(run=_rollup, local_only=True)


def _day(value: str) -> dt.date:
    try:
        return dt.date.fromisoformat(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{value!r} is not a day: give it as YYYY-MM-DD") from exc


def _rollup(args: argparse.Namespace) -> int:
    settings = Settings()  # a bad setting is reported before the database is touched
    from sqlalchemy import func, select

    from app.db import migrate, rollups
    from app.db.models import UsageRecord
    from app.db.session import Database

    database = Database(settings.database_url)
    try:
        try:
            migrate.check_current(database.engine)
        except migrate.NotMigrated as exc:
            print(f"arbiter: {exc}", file=sys.stderr)
            return 2
        if database.engine.dialect.name == "postgresql":
            moved = _move_legacy(database)
            if moved:
                print(f"{moved} usage records of the previous release moved into usage_ledger first")
        with database.session() as session:
            first = session.scalar(select(func.min(UsageRecord.at)))
        today = dt.datetime.now(dt.UTC).date()
        since: dt.date | None = args.since
        if since is None:
            if first is None:
                print("the usage ledger is empty: nothing to count")
                return 0
            since = (first if first.tzinfo is None else first.astimezone(dt.UTC)).date()
        if since > today:
            raise InvalidRequest(f"--since {since} is after today ({today}, UTC)")
        started, written = time.monotonic(), 0
        by_the_hour = rollups.by_the_hour_from(today)
        for start, end in rollups.days(since, today):
            with database.engine.begin() as connection:  # a day a transaction: the ledger waits that long
                counted = rollups.rebuild(connection, start, end)
                if end <= by_the_hour:  # the day level: one row per key
                    counted = rollups.merge_day(connection, start)
                written += counted
        days = (today - since).days + 1
        print(f"usage rollups counted again for {days} day(s), {since} to {today}: {written} rollup rows "
              f"in {time.monotonic() - started:.1f} s", file=sys.stdout)
        return 0
    finally:
        database.dispose()


def _move_legacy(database: Any) -> int:
    """The rows the previous release wrote into ``usage_records`` (0018), moved into the ledger
    before they are counted (the maintenance job would, in its own time)."""
    from app.telemetry import retention

    moved = 0
    while retention.legacy_rows(database.engine):
        batch = retention.move_legacy_batch(database.engine)
        moved += batch
        if batch < retention.LEGACY_BATCH:
            break
    return moved
