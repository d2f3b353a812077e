"""Usage maintenance: the ledger's day partitions, the previous release's rows, retention.

Run by one replica at a time (the ``usage-maintenance`` lease), soon after start and then every
ARBITER_USAGE_MAINTENANCE_INTERVAL seconds. Each step is a short transaction of its own, under a
statement and a lock timeout (a step waiting on a lock would hold every writer queued behind it):
one that fails is logged and tried again at the next run; nothing here stops the process.

1. PostgreSQL: the day partitions of ``usage_ledger`` from yesterday to ``DAYS_AHEAD`` days ahead
   exist. Rows of such a day already in the DEFAULT partition (a partition made late) are moved
   into it in the same transaction, or the day is skipped (logged) until they can be.
2. PostgreSQL: rows the previous release wrote into ``usage_records`` (migration 0018) are moved
   into ``usage_ledger``, keeping their ids, ``LEGACY_BATCH`` at a time with a pause between
   batches, so the ledger's own writes go on.
3. ARBITER_USAGE_RETENTION_DAYS: a day partition past it is dropped whole (instant, whatever its
   size); older rows in the DEFAULT partition (or on SQLite, everywhere) are deleted in batches.
   ARBITER_ROLLUP_RETENTION_DAYS: the rollups, a day at a time, whole UTC days only.
4. The rollups of the days before yesterday are merged, a day a transaction, into one row per key
   at the day's 00:00 (app/db/rollups.py's ``merge_day``): reports over weeks read days, not hours.
   A day written to late (a replayed spool) is merged again at the next run.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import Connection, Table, delete, func, select, text
from sqlalchemy.engine import Engine

from app.db import lease, rollups
from app.db.models import UsageRecord
from app.db.rollups import LATENCY, ROLLUPS
from app.db.session import Database

log = logging.getLogger("arbiter.usage")
LEASE = "usage-maintenance"
LEDGER = UsageRecord.__tablename__
DEFAULT = f"{LEDGER}_default"
LEGACY = "usage_records"  # the table of the releases before 0018 (PostgreSQL)
DAYS_BEHIND, DAYS_AHEAD = 1, 7  # the day partitions kept made: yesterday (a late record) to a week ahead
LEGACY_BATCH = 5000
LEGACY_BATCHES_PER_RUN = 200  # a million rows a run at most; the next run comes soon while some are left
LEGACY_PAUSE = 0.2  # seconds between two batches: the ledger's writes get their turn
DELETE_BATCH = 10_000
DELETE_BATCHES_PER_RUN = 100
MERGE_DAYS_PER_RUN = 100  # days of rollups merged a run at most (after the upgrade: the next run comes soon)
FIRST_RUN_AFTER = 30.0  # seconds after start: the first run
SOON = 60.0  # seconds to the next run while rows wait to be moved or deleted
STATEMENT_TIMEOUT = "60s"
LOCK_TIMEOUT = "5s"
COLUMNS = ("id, at, request_id, project_id, key_id, operation, model, provider, status, input_tokens, "
           "output_tokens, latency_ms, record_uid, alias")
_DAY = re.compile(rf"^{LEDGER}_p(\d{{8}})$")


@dataclass
class Outcome:
    """What one run did (logged, and read by the tests)."""

    created: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    moved: int = 0  # legacy rows moved into the ledger
    dropped: list[str] = field(default_factory=list)  # day partitions past the retention
    deleted: int = 0  # usage rows deleted one by one (the DEFAULT partition, SQLite)
    rollups_deleted: int = 0
    days_merged: int = 0  # days whose hourly rollups were merged into one row per key
    partitions: int | None = None  # day partitions there now (PostgreSQL)
    more: bool = False  # rows left to move or delete: run again soon
    failed: list[str] = field(default_factory=list)


def _postgresql(engine: Engine) -> bool:
    return engine.dialect.name == "postgresql"


def _bounded(connection: Connection) -> None:
    """This transaction's statement and lock timeouts (PostgreSQL)."""
    if connection.dialect.name == "postgresql":
        connection.exec_driver_sql(f"SET LOCAL statement_timeout = '{STATEMENT_TIMEOUT}'")
        connection.exec_driver_sql(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")


def _midnight(day: dt.date) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(), dt.UTC)


def day_partitions(engine: Engine) -> dict[dt.date, str]:
    """The ledger's day partitions there, by day (PostgreSQL)."""
    with engine.connect() as connection:
        names = connection.execute(text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = :parent "
            "AND p.relnamespace = to_regnamespace(current_schema())::oid"), {"parent": LEDGER}).scalars().all()
    found = {}
    for name in names:
        match = _DAY.match(name)
        if match:
            found[dt.datetime.strptime(match.group(1), "%Y%m%d").date()] = name
    return found


def ensure_partitions(engine: Engine, today: dt.date, outcome: Outcome) -> None:
    """Make the day partitions from yesterday to ``DAYS_AHEAD`` days ahead that are missing."""
    there = day_partitions(engine)
    for offset in range(-DAYS_BEHIND, DAYS_AHEAD + 1):
        day = today + dt.timedelta(days=offset)
        if day in there:
            continue
        name = f"{LEDGER}_p{day:%Y%m%d}"
        window = {"start": _midnight(day), "end": _midnight(day + dt.timedelta(days=1))}
        bounds = f"FROM ('{window['start'].isoformat()}') TO ('{window['end'].isoformat()}')"
        try:
            with engine.begin() as connection:
                _bounded(connection)
                waiting = connection.execute(text(
                    f"SELECT 1 FROM {DEFAULT} WHERE at >= :start AND at < :end LIMIT 1"), window).scalar()
                if waiting is None:
                    connection.exec_driver_sql(f"CREATE TABLE IF NOT EXISTS {name} PARTITION OF {LEDGER} "
                                               f"FOR VALUES {bounds}")
                else:
                    # The day's rows are in the DEFAULT partition: a partition cannot be made over
                    # them. Made as a table, filled from the DEFAULT, then attached, in one
                    # transaction; inserts into the DEFAULT wait meanwhile (a day made late is
                    # one of few rows: the ledger writes ahead of time).
                    connection.exec_driver_sql(f"LOCK TABLE {DEFAULT} IN SHARE ROW EXCLUSIVE MODE")
                    connection.exec_driver_sql(f"CREATE TABLE {name} (LIKE {LEDGER} INCLUDING DEFAULTS)")
                    moved = connection.execute(text(
                        f"WITH moved AS (DELETE FROM {DEFAULT} WHERE at >= :start AND at < :end RETURNING *) "
                        f"INSERT INTO {name} SELECT * FROM moved"), window).rowcount
                    connection.exec_driver_sql(f"ALTER TABLE {LEDGER} ATTACH PARTITION {name} FOR VALUES {bounds}")
                    log.info("usage partition %s made with the %d rows of its day the default partition held",
                             name, moved)
            outcome.created.append(name)
        except Exception as exc:  # noqa: BLE001 - the next run tries again; rows go to the DEFAULT meanwhile
            outcome.skipped.append(name)
            log.warning("the usage partition %s could not be made (tried again at the next run): %s", name, exc)


def legacy_rows(engine: Engine) -> bool:
    """Whether the previous release's ``usage_records`` holds rows (PostgreSQL)."""
    with engine.connect() as connection:
        if connection.execute(text("SELECT to_regclass(:name)"), {"name": LEGACY}).scalar() is None:
            return False
        return connection.execute(text(f"SELECT 1 FROM {LEGACY} LIMIT 1")).scalar() is not None


def move_legacy_batch(engine: Engine, batch: int = LEGACY_BATCH) -> int:
    """Move the oldest ``batch`` rows of ``usage_records`` into the ledger, ids kept, in one
    transaction; a row there already (moved before, or written twice) is not added again. Answers
    the rows taken out of ``usage_records``."""
    with engine.begin() as connection:
        _bounded(connection)
        taken = connection.execute(text(
            f"WITH moved AS (DELETE FROM {LEGACY} WHERE id IN (SELECT id FROM {LEGACY} ORDER BY id LIMIT :batch) "
            f"RETURNING {COLUMNS}), stored AS (INSERT INTO {LEDGER} ({COLUMNS}) SELECT {COLUMNS} FROM moved "
            f"ON CONFLICT DO NOTHING) SELECT count(*) FROM moved"), {"batch": batch}).scalar()
    return int(taken or 0)


def drop_old_partitions(engine: Engine, cutoff: dt.datetime, outcome: Outcome) -> None:
    """Drop the day partitions whose upper bound is at or before ``cutoff``."""
    for day, name in sorted(day_partitions(engine).items()):
        if _midnight(day + dt.timedelta(days=1)) > cutoff:
            continue
        with engine.begin() as connection:
            _bounded(connection)  # the parent's lock is brief, but waited for no longer than this
            connection.exec_driver_sql(f"DROP TABLE IF EXISTS {name}")
        outcome.dropped.append(name)
        log.info("usage partition %s dropped: past ARBITER_USAGE_RETENTION_DAYS", name)


def delete_old_rows(engine: Engine, cutoff: dt.datetime, outcome: Outcome, batch: int = DELETE_BATCH) -> None:
    """Delete records older than ``cutoff`` ``batch`` at a time: on PostgreSQL from the DEFAULT
    partition (the days are dropped whole), on SQLite from the ledger."""
    for _ in range(DELETE_BATCHES_PER_RUN):
        with engine.begin() as connection:
            _bounded(connection)
            if connection.dialect.name == "postgresql":
                gone = connection.execute(text(
                    f"DELETE FROM {DEFAULT} WHERE (id, at) IN (SELECT id, at FROM {DEFAULT} WHERE at < :cutoff "
                    "LIMIT :batch)"), {"cutoff": cutoff, "batch": batch}).rowcount
            else:
                t = cast(Table, UsageRecord.__table__)
                gone = connection.execute(delete(t).where(t.c.id.in_(
                    select(t.c.id).where(t.c.at < cutoff).limit(batch)))).rowcount
        outcome.deleted += int(gone or 0)
        if not gone or gone < batch:
            return
    outcome.more = True


def delete_old_rollups(engine: Engine, cutoff: dt.datetime, outcome: Outcome) -> None:
    """Delete the rollups of the hours before ``cutoff``, a day at a time (the oldest first)."""
    for table in (ROLLUPS, LATENCY):
        for _ in range(DELETE_BATCHES_PER_RUN):
            with engine.begin() as connection:
                _bounded(connection)
                first = connection.execute(select(func.min(table.c.hour))).scalar()
                if first is None:
                    break
                first = first if first.tzinfo is not None else first.replace(tzinfo=dt.UTC)  # SQLite: UTC
                if first >= cutoff:
                    break
                until = min(cutoff, first + dt.timedelta(days=1))
                outcome.rollups_deleted += int(connection.execute(
                    delete(table).where(table.c.hour < until)).rowcount or 0)
        else:
            outcome.more = True


def merge_old_days(engine: Engine, before: dt.datetime, outcome: Outcome, limit: int = MERGE_DAYS_PER_RUN) -> None:
    """Merge the rollups of every day before ``before`` that has hours (``rollups.merge_day``), the
    oldest first, a day a transaction, ``limit`` days at most."""
    since: dt.datetime | None = None
    for _ in range(limit):
        with engine.begin() as connection:
            _bounded(connection)
            day = rollups.next_hourly_day(connection, since, before)
            if day is None:
                return
            since = _midnight(day)
            rollups.merge_day(connection, since)
        outcome.days_merged += 1
        since += dt.timedelta(days=1)
    with engine.connect() as connection:
        outcome.more = outcome.more or rollups.next_hourly_day(connection, since, before) is not None


class UsageMaintenance:
    """The job, on the replica holding the ``usage-maintenance`` lease."""

    def __init__(self, database: Database, *, interval: float, retention_days: int, rollup_retention_days: int,
                 on_run: Callable[[Outcome], Any] | None = None,
                 clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)) -> None:
        self._database = database
        self.interval = interval
        self.retention_days = retention_days
        self.rollup_retention_days = rollup_retention_days
        self._on_run = on_run
        self._clock = clock
        self.runs = 0
        self.partitions: int | None = None  # day partitions at the last run (PostgreSQL): a metric
        self._step: asyncio.Future[Any] | None = None

    async def _in_thread(self, work: Callable[[], Any]) -> Any:
        """``work`` in a worker thread, kept track of: a cancel stops the wait, not the transaction."""
        self._step = asyncio.ensure_future(asyncio.to_thread(work))
        return await asyncio.shield(self._step)

    async def settled(self, timeout: float) -> None:
        """Until the step under way has ended (at most ``timeout`` seconds): before the pool closes."""
        if self._step is not None and not self._step.done():
            await asyncio.wait({self._step}, timeout=timeout)

    async def run_once(self) -> Outcome:
        """Every step, each on its own: one failing does not keep the others from running."""
        outcome = Outcome()
        engine = self._database.engine
        now = self._clock()
        started = time.monotonic()

        async def step(name: str, work: Callable[[], Any]) -> None:
            try:
                await self._in_thread(work)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - logged; the next run tries again
                outcome.failed.append(name)
                log.warning("usage maintenance: %s failed (tried again at the next run): %s", name, exc)

        postgresql = _postgresql(engine)
        if postgresql:
            await step("partitions", lambda: ensure_partitions(engine, now.date(), outcome))
            await step("legacy rows", lambda: self._legacy(outcome))
            if outcome.moved:  # a batch at a time, the event loop free between them
                for _ in range(LEGACY_BATCHES_PER_RUN - 1):
                    await asyncio.sleep(LEGACY_PAUSE)
                    before = outcome.moved
                    await step("legacy rows", lambda: self._legacy(outcome))
                    if outcome.moved - before < LEGACY_BATCH:
                        break
                else:
                    outcome.more = True
        if self.retention_days:
            cutoff = now - dt.timedelta(days=self.retention_days)
            if postgresql:
                await step("retention", lambda: drop_old_partitions(engine, cutoff, outcome))
            await step("retention", lambda: delete_old_rows(engine, cutoff, outcome))
        if self.rollup_retention_days:  # a day goes whole, once all of it is past
            cutoff = _midnight((now - dt.timedelta(days=self.rollup_retention_days)).date())
            await step("rollup retention", lambda: delete_old_rollups(engine, cutoff, outcome))
        await step("rollup days", lambda: merge_old_days(engine, rollups.by_the_hour_from(now.date()), outcome))
        if postgresql:
            try:
                outcome.partitions = len(await self._in_thread(lambda: day_partitions(engine)))
                self.partitions = outcome.partitions
            except Exception as exc:  # noqa: BLE001 - the gauge keeps its last value
                log.warning("usage maintenance: the partitions could not be counted: %s", exc)
        self.runs += 1
        log.info("usage maintenance in %.1f s: %d partition(s) made, %d legacy row(s) moved, %d partition(s) "
                 "dropped, %d row(s) and %d rollup row(s) deleted, %d day(s) of rollups merged%s",
                 time.monotonic() - started, len(outcome.created), outcome.moved, len(outcome.dropped),
                 outcome.deleted, outcome.rollups_deleted, outcome.days_merged,
                 f"; failed: {', '.join(sorted(set(outcome.failed)))}" if outcome.failed else "")
        if self._on_run is not None:
            self._on_run(outcome)
        return outcome

    def _legacy(self, outcome: Outcome) -> None:
        if legacy_rows(self._database.engine):
            outcome.moved += move_legacy_batch(self._database.engine)

    async def run(self, first_after: float = FIRST_RUN_AFTER) -> None:
        """Soon after start, then every ``interval`` seconds (sooner while rows wait), on the lease holder."""
        wait = first_after
        while True:
            await asyncio.sleep(wait)
            wait = self.interval
            try:
                held = await asyncio.to_thread(lease.try_hold, self._database, LEASE,
                                               max(self.interval * 2.5, 120.0))
                if held:
                    outcome = await self.run_once()
                    if outcome.more:
                        wait = min(self.interval, SOON)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the database may be away: the next run tries again
                log.warning("usage maintenance failed; it goes on at the next interval: %s", exc)

    def release(self) -> None:
        lease.release(self._database, LEASE)
