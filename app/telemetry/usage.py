"""The usage ledger: every decision or chat request of a project, per key and model, written
in batches off the request path and flushed on a clean shutdown, so no record is lost. With a
spool directory, each record is also journaled there as it comes (app/telemetry/spool.py), so a
process killed outright loses at most the last fsync interval's records."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import logging
import os
import time
from collections.abc import Callable, Collection
from itertools import chain
from pathlib import Path
from typing import Any

from sqlalchemy import Date, case, func, literal, select, tuple_
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session

from app import audit
from app.db.models import Project, UsageRecord, UsageRollup
from app.db.rollups import Increments
from app.db.session import Database
from app.db.timestamps import as_utc
from app.errors import InvalidRequest
from app.telemetry.record import RequestRecord
from app.telemetry.spool import Journal
from app.telemetry.usage_report import mean_latency, project_ids, rolled

log = logging.getLogger("arbiter.usage")
BATCH = 5000
MAX_PENDING = 500_000  # records held while the database is away (~250 MB); past it the oldest go
SHUTDOWN_RETRY = 5.0  # seconds a shutdown keeps trying a database that is away, before the spool
DROP_LOG_EVERY = 60.0  # seconds between two log lines about dropped records
# A row of the ledger, in this order (see ``UsageLedger.add``).
COLUMNS = ("at", "request_id", "project_id", "key_id", "operation", "model", "provider", "status",
           "input_tokens", "output_tokens", "latency_ms", "alias", "record_uid")
# A spooled row written before the ``alias`` column (0011) lacks it: read with no alias.
_ALIAS_AT = COLUMNS.index("alias")
# ``add`` builds the row without its last column, the uid: the writer adds it when it takes a batch.
WITHOUT_UID = len(COLUMNS) - 1
ROWS_PER_INSERT = 999 // len(COLUMNS)  # 83 rows, 996 parameters: under the 999 of the oldest SQLite builds


class UsageLedger:
    """Rows are kept as tuples and written as multi-row INSERTs of ``ROWS_PER_INSERT`` rows.

    The writer runs in a thread. The ORM's bulk insert (or any executemany) steps the database
    once per row, and the driver lets go of the GIL at every step: thousands of handovers a
    second between the writer and the event loop, which cost ~17% of the CPU of a decision in
    the benchmark (bench/run.py) though the rows themselves are cheap. One statement per 83 rows
    hands over ~83 times less often."""

    def __init__(self, database: Database, on_dropped: Callable[[int], Any] | None = None,
                 spool_dir: str | Path | None = None, on_write_error: Callable[[], Any] | None = None,
                 journal: Journal | None = None) -> None:
        self._database = database
        # The spool: a journal of every record (``journal`` given), or of what a shutdown is left with.
        self.journal = journal if journal is not None else (
            Journal(Path(spool_dir), journaling=False) if spool_dir is not None else None)
        self._journaling = self.journal is not None and self.journal.journaling
        self._unrecorded: dict[str, int] = {}  # drops not yet in the audit log: reason -> records
        self._pending: list[tuple[Any, ...]] = []
        self._lock = asyncio.Lock()
        self.dropped = 0  # records given up: over MAX_PENDING during an outage, or unwritable
        self._on_dropped = on_dropped  # the metric arbiter_usage_records_dropped_total
        self._on_write_error = on_write_error  # arbiter_usage_write_errors_total: a batch kept to retry
        self._unlogged = 0  # dropped since the last log line about it
        self._logged_at = -DROP_LOG_EVERY
        dialect = database.engine.dialect
        # The column's own conversion (SQLite stores a datetime as text in SQLAlchemy's format),
        # or the same text at half the cost when it gives the same answer.
        self._at: Callable[[Any], Any] | None = (
            UsageRecord.__table__.c.at.type.dialect_impl(dialect).bind_processor(dialect))
        sample = dt.datetime(2001, 2, 3, 4, 5, 6, 7, tzinfo=dt.UTC)
        if self._at is not None and self._at(sample) == _sqlite_text(sample):
            self._at = _sqlite_text
        self._mark = "?" if dialect.paramstyle == "qmark" else "%s"  # sqlite3 / psycopg
        self._inserts: dict[int, str] = {}

    def add(self, record: RequestRecord) -> None:
        if not record.billable or record.model is None:
            return
        if len(self._pending) >= MAX_PENDING:
            self._over_bound()
        at = record.at or dt.datetime.now(dt.UTC)
        row: tuple[Any, ...] = (
            at if self._at is None else self._at(at), record.request_id[:64], record.project_id,
            record.key_id or None, record.operation, record.model[:200], record.provider, record.status,
            record.input_tokens or 0, record.output_tokens or 0, round(record.seconds * 1000, 3),
            record.alias[:200] if record.alias is not None else None,
        )
        if self._journaling:  # a uid now, so the journal and the database name it alike
            assert self.journal is not None
            row += (self.journal.uid(),)
            self.journal.append(row)
        self._pending.append(row)

    def _over_bound(self) -> None:
        """The buffer is full (the database away for long): the oldest record leaves memory. When
        the spool holds it, the next start writes it; otherwise it is lost, and counted."""
        gone = self._pending[: len(self._pending) - MAX_PENDING + 1]
        del self._pending[: len(gone)]
        journal = self.journal
        lost = len(gone) if journal is None else sum(
            1 for row in gone if not (len(row) > WITHOUT_UID and journal.holds(row[WITHOUT_UID])))
        if lost:
            self._drop(lost, f"the usage buffer is full ({MAX_PENDING} records) while the database is away")

    async def durable(self) -> None:
        """ARBITER_USAGE_DURABLE=always: wait until the records added so far are fsynced."""
        if self._journaling:
            assert self.journal is not None
            await self.journal.synced()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def _drop(self, count: int, why: str) -> None:
        """Count records given up; log at most one line every ``DROP_LOG_EVERY`` seconds."""
        self.dropped += count
        if self._on_dropped is not None:
            self._on_dropped(count)
        reason = why.split(" (", 1)[0]
        self._unrecorded[reason] = self._unrecorded.get(reason, 0) + count
        self._unlogged += count
        now = time.monotonic()
        if now - self._logged_at >= DROP_LOG_EVERY:
            log.error("%d usage record(s) dropped: %s (%d dropped since start)", self._unlogged, why,
                      self.dropped)
            self._unlogged, self._logged_at = 0, now

    async def flush(self) -> None:
        async with self._lock:  # one writer at a time: the timer and shutdown may meet
            while self._pending:
                batch, self._pending = _with_uids(self._pending[:BATCH]), self._pending[BATCH:]
                try:
                    await asyncio.to_thread(self._write, batch)
                    self._confirm(batch)
                except Exception as exc:  # noqa: BLE001 - sorted below: away, or about the rows
                    if _database_away(exc):  # keep the records and try again later
                        log.warning("writing %d usage records failed; will retry: %s", len(batch), exc)
                        self._pending[:0] = batch
                        self._write_failed()
                        return
                    # Something in the batch cannot be stored at all (a DataError, an
                    # IntegrityError, sqlite3's OverflowError for a number past 64 bits): write
                    # row by row, so one bad row never blocks every other record behind it.
                    unwritten = await asyncio.to_thread(self._write_one_by_one, batch)
                    self._confirm(batch[:len(batch) - len(unwritten)])  # written, or never storable
                    if unwritten:  # the database went away in the middle: those wait for the next try
                        self._pending[:0] = unwritten
                        self._write_failed()
                        return

            if self._unrecorded:
                await asyncio.to_thread(self._record_drops)

    def _confirm(self, rows: list[tuple[Any, ...]]) -> None:
        """These rows are in the database: the spool need not keep them."""
        if self.journal is not None and (self._journaling or self.journal.pending_records()):
            self.journal.confirm(rows)

    def _record_drops(self) -> None:
        """The drops counted since the last time, as an audit entry (the database is there: a batch
        was just written): ``usage.records_dropped``, the records per reason in its details."""
        dropped, self._unrecorded = self._unrecorded, {}
        try:
            with self._database.session() as session:
                audit.record(session, actor="arbiter", action="usage.records_dropped", target=f"pid {os.getpid()}",
                             details={"records": sum(dropped.values()), "reasons": dropped})
        except Exception as exc:  # noqa: BLE001 - tried again after the next batch
            for reason, count in dropped.items():
                self._unrecorded[reason] = self._unrecorded.get(reason, 0) + count
            log.warning("the count of dropped usage records cannot be written to the audit log yet: %s", exc)

    def _write_failed(self) -> None:
        if self._on_write_error is not None:
            self._on_write_error()

    async def close(self, retry_for: float = SHUTDOWN_RETRY) -> None:
        """The shutdown's flush: retry a database that is away for ``retry_for`` seconds; what is
        left stays in the spool (journaled, or written now), which the next start writes
        (``load_spool``). Counted as dropped only what the spool cannot take (no directory, or a
        full disk: what fits is kept)."""
        deadline = time.monotonic() + retry_for
        await self.flush()
        while self._pending and time.monotonic() < deadline:
            await asyncio.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
            await self.flush()
        journal = self.journal
        if not self._pending:
            if journal is not None:
                await asyncio.to_thread(journal.close)
            return
        async with self._lock:
            rows, self._pending = _with_uids(self._pending), []
            if journal is None:
                log.error("the database is away at shutdown and there is no usage spool: %d usage records "
                          "are lost", len(rows))
                self._drop(len(rows), "lost at shutdown")
                return
            try:
                if not self._journaling:  # only now: what is not in a claimed file already
                    await asyncio.to_thread(journal.open)
                    for row in rows:
                        if not journal.holds(row[-1]):
                            journal.append(row)
                lost = await asyncio.to_thread(journal.close)
            except Exception as exc:  # noqa: BLE001 - reported and counted: nothing else can be done
                log.error("the database is away at shutdown and the usage spool could not be written "
                          "(%s): %d usage records are lost", exc, len(rows))
                self._drop(len(rows), "lost at shutdown")
                return
        if lost:
            self._drop(lost, "lost at shutdown: the usage spool is full")
        log.error("the database is away at shutdown: %d usage records kept in the spool in %s, written at the "
                  "next start%s", len(rows) - lost, journal.directory,
                  f"; {lost} lost (the spool is full)" if lost else "")

    async def open(self) -> None:
        """Start the journal (with a spool directory and ARBITER_USAGE_DURABLE): its lock, its writer."""
        if self._journaling:
            assert self.journal is not None
            await asyncio.to_thread(self.journal.open)
            self.journal.start()

    def load_spool(self) -> int:
        """Put the records that processes no longer running left in the spool back in the buffer
        (they keep their uids: written twice, they are stored once). A file is claimed by renaming
        it, so two replicas never both take it, and kept until its records are in the database.
        Answers how many records were loaded."""
        if self.journal is None:
            return 0
        found = self.journal.recover()
        loaded: list[tuple[Any, ...]] = []
        for values in found.rows:
            try:
                loaded.append(self._from_spool(values))
            except (ValueError, TypeError) as exc:
                log.error("a spooled usage record cannot be read (%s): left out", exc)
                self.journal.forget(values[-1])
                found.unreadable += 1
        if found.unreadable:
            self._drop(found.unreadable, "unreadable in the usage spool")
        if loaded:
            self._pending[:0] = loaded
            log.warning("loaded %d usage records from %d spool file(s) of processes no longer running",
                        len(loaded), found.files)
        if found.files:
            self.journal.start()  # to remove each file once its records are in the database
        return len(loaded)

    def _from_spool(self, values: list[Any]) -> tuple[Any, ...]:
        if len(values) == len(COLUMNS) - 1:  # spooled by a release from before the alias column
            values = [*values[:_ALIAS_AT], None, *values[_ALIAS_AT:]]
        if len(values) != len(COLUMNS):
            raise ValueError(f"a spooled row has {len(values)} values, not {len(COLUMNS)}")
        at = dt.datetime.fromisoformat(values[0])
        at = at if at.tzinfo is not None else at.replace(tzinfo=dt.UTC)  # SQLite's text is UTC
        return (at if self._at is None else self._at(at), *values[1:])

    def _insert(self, rows: int) -> str:
        """INSERT of ``rows`` rows (cached: a batch needs at most two sizes)."""
        sql = self._inserts.get(rows)
        if sql is None:
            row = "(" + ", ".join([self._mark] * len(COLUMNS)) + ")"
            # A retried batch whose first COMMIT landed (the answer lost) inserts nothing twice.
            # ON CONFLICT with a target (not SQLite's INSERT OR IGNORE, which would also skip a
            # NOT NULL violation silently): only a uid already there is skipped (with its ``at``:
            # the unique index of a table partitioned on it holds it; a row's ``at`` never changes).
            # RETURNING: the rows actually stored, the only ones the rollups count.
            sql = (f"INSERT INTO {UsageRecord.__tablename__} ({', '.join(COLUMNS)}) VALUES "
                   + ", ".join([row] * rows) + " ON CONFLICT (record_uid, at) DO NOTHING RETURNING record_uid")
            if len(self._inserts) < 16:
                self._inserts[rows] = sql
        return sql

    def _write(self, batch: list[tuple[Any, ...]]) -> None:
        """Insert ``batch`` and add what it stored to the rollups (app/db/rollups.py), in one
        transaction: a row skipped by the uid guard (its batch's first COMMIT landed) counts once."""
        with self._database.engine.begin() as connection:
            stored: set[str] = set()
            for start in range(0, len(batch), ROWS_PER_INSERT):
                rows = batch[start:start + ROWS_PER_INSERT]
                result = connection.exec_driver_sql(self._insert(len(rows)), tuple(chain.from_iterable(rows)))
                stored.update(uid for (uid,) in result)
            increments = Increments(connection.dialect.name)
            for row in batch:
                if row[-1] in stored:
                    increments.add(at=row[0], project_id=row[2], key_id=row[3], operation=row[4], model=row[5],
                                   provider=row[6], status=row[7], input_tokens=row[8], output_tokens=row[9],
                                   latency_ms=row[10], alias=row[11])
            increments.write(connection)

    def _write_one_by_one(self, batch: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        """Write ``batch`` a row at a time, dropping (and counting) the rows that cannot be stored.
        Answers the rows not tried when the database went away in the middle."""
        for index, row in enumerate(batch):
            try:
                self._write([row])
            except Exception as exc:  # noqa: BLE001 - sorted below: away, or about this row
                if _database_away(exc):
                    log.warning("writing usage records row by row failed; %d will be retried: %s",
                                len(batch) - index, exc)
                    return batch[index:]
                shown = {k: row[COLUMNS.index(k)] for k in ("request_id", "model", "status")}
                self._drop(1, f"a record cannot be stored ({type(exc).__name__}: {shown})")
        return []

    async def run(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            # Shielded: cancelling this loop at shutdown must not cancel a write whose batch is
            # already off the buffer (a queued write would be dropped). The final flush waits for
            # it on the lock, then writes the rest.
            try:
                await asyncio.shield(self.flush())
            except asyncio.CancelledError:
                raise
            except Exception:  # never let the writer die: the records stay buffered
                log.exception("the usage writer failed; it goes on at the next interval")


def _with_uids(batch: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The batch with a unique id at the end of every row that has none yet (a re-queued row keeps
    the one it was first tried with). 96 random bits per batch and the row's place in it: one
    ``urandom`` per batch, not per request."""
    prefix = os.urandom(12).hex()
    return [row if len(row) > WITHOUT_UID else (*row, f"{prefix}{index:08x}")
            for index, row in enumerate(batch)]


def _database_away(exc: BaseException) -> bool:
    """A connection-level failure (worth retrying later), not something about the rows."""
    if isinstance(exc, (OperationalError, InterfaceError, PoolTimeout, ConnectionError)):
        return True
    return isinstance(exc, DBAPIError) and exc.connection_invalidated


def _sqlite_text(at: dt.datetime) -> str:
    """SQLAlchemy's SQLite text for a datetime, "2001-02-03 04:05:06.000007" (the zone left off)."""
    return at.isoformat(" ", "microseconds")[:26]


def summary(session: Session, *, project: str | None = None, since: dt.date | None = None,
            until: dt.date | None = None, projects: Collection[str] | None = None, limit: int | None = None,
            after: tuple[dt.date, str, str] | None = None) -> list[dict[str, Any]]:
    """Usage per day and per model (and per project when no project is named); ``projects``
    keeps only those projects (a project-admin's). Days are UTC days, in the buckets as in
    ``since`` and ``until``. Read from the rollups (app/db/rollups.py).

    Ordered by day, model and project (no project: ''), ``limit`` rows at most, those after the
    row ``after`` names (``cursor`` of the last row of a page) when given."""
    r = UsageRollup
    day = _utc_day(session)
    named = func.coalesce(Project.name, "")
    grouped = rolled(session, select(
        day.label("day"), r.model.label("model"), named.label("named"), Project.name.label("project"),
        func.sum(r.requests).label("requests"), func.sum(r.input_tokens).label("input_tokens"),
        func.sum(r.output_tokens).label("output_tokens"),
        func.sum(case((r.status >= 400, r.requests), else_=0)).label("errors"),
        func.sum(r.latency_ms).label("latency_ms")),
        dt.datetime.combine(since, dt.time(), dt.UTC) if since is not None else None,
        # the last day there is bounds nothing
        dt.datetime.combine(until + dt.timedelta(days=1), dt.time(), dt.UTC)
        if until is not None and until < dt.date.max else None,
        project, projects).group_by(day, r.model, Project.name).subquery()
    query = select(grouped).order_by(grouped.c.day, grouped.c.model, grouped.c.named)
    if after is not None:
        query = query.where(tuple_(grouped.c.day, grouped.c.model, grouped.c.named)
                            > tuple_(literal(after[0], Date), literal(after[1]), literal(after[2])))
    if limit is not None:
        query = query.limit(limit)
    return [
        {"day": str(row.day), "model": row.model, "project": row.project, "requests": int(row.requests),
         "input_tokens": int(row.input_tokens or 0), "output_tokens": int(row.output_tokens or 0),
         "errors": int(row.errors or 0), "mean_latency_ms": mean_latency(row, 3)}
        for row in session.execute(query)
    ]


def cursor(row: dict[str, Any]) -> str:
    """Where the page after ``row`` (a ``summary`` row) starts: an opaque token."""
    token = json.dumps([row["day"], row["model"], row["project"] or ""], separators=(",", ":"))
    return base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")


def after_cursor(token: str) -> tuple[dt.date, str, str]:
    """A ``cursor`` read back; InvalidRequest when it is not one."""
    try:
        day, model, project = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        return dt.date.fromisoformat(day), str(model), str(project)
    except (ValueError, TypeError) as exc:
        raise InvalidRequest("cursor is not one this API gave: pass the 'next' of the previous page "
                             "as it came") from exc


def _utc_day(session: Session) -> Any:
    """The UTC day of a rollup's hour, as SQL. PostgreSQL's date() of a timestamptz is the day
    in the session's TimeZone (a libpq PGTZ, a role's or the server's setting); SQLite keeps the
    UTC time as text."""
    if session.get_bind().dialect.name == "postgresql":
        return func.date(func.timezone("UTC", UsageRollup.hour))
    return func.date(UsageRollup.hour)


def recent(session: Session, *, project: str | None = None, limit: int = 50,
           projects: Collection[str] | None = None) -> list[dict[str, Any]]:
    """The latest ``limit`` records, newest first. A project is read by its id, newest first along
    ``ix_usage_ledger_project_at`` (one query per project: an IN list would read the time index back
    until enough of them turn up, the whole table for a dormant project)."""
    ids = project_ids(session, project, projects)
    newest = (UsageRecord.at.desc(), UsageRecord.id.desc())
    base = select(UsageRecord, Project.name).outerjoin(Project, Project.id == UsageRecord.project_id)
    if ids is None:
        found = list(session.execute(base.order_by(*newest).limit(limit)))
    else:
        found = [row for one in ids
                 for row in session.execute(base.where(UsageRecord.project_id == one).order_by(*newest).limit(limit))]
        found.sort(key=lambda row: (as_utc(row[0].at), row[0].id), reverse=True)
    return [
        {"at": as_utc(r.at).isoformat(), "request_id": r.request_id,
         "project": name, "key_id": r.key_id, "operation": r.operation, "model": r.model, "alias": r.alias,
         "provider": r.provider, "status": r.status, "input_tokens": r.input_tokens,
         "output_tokens": r.output_tokens, "latency_ms": r.latency_ms}
        for r, name in found[:limit]
    ]
