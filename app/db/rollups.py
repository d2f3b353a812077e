"""The usage rollups: the ledger's totals per UTC hour (``UsageRollup``) and its latency histogram
per hour and project (``UsageLatencyRollup``), so a report over 90 days reads a few thousand rows,
not every request.

They are kept in the transaction that writes the records: the ledger adds the increments of the
rows its INSERT actually stored (``RETURNING record_uid``: a retried batch's rows skipped by the
uid guard add nothing), and rows added through the ORM (tools, tests) are counted in the same
flush (``track``). Rows written by anything else (a bulk import, a restore) are counted by
``rebuild``: ``arbiter usage rollup``, and migration 0017 for the rows already there.

Days before yesterday are kept by the day (``merge_day``): the usage maintenance (app/telemetry/
retention.py) merges the hours of each such day into one row per key at its 00:00, so a report over
90 days reads 88 days' rows, not 2,000 hours'. Every report but the last 24 hours' groups by the
day, and reads the same sums either way (the histogram's bins too: counts summed, lowest and highest
kept). A record written late (a spool replayed days on) adds an hour's row to a merged day: the
day's sums stay right, and the next run merges it again.

An increment is an upsert, ``ON CONFLICT DO UPDATE SET n = n + excluded.n``, the rows of a batch
summed first and written in key order (two replicas writing the same hour lock its rows in the
same order: no deadlock)."""

from __future__ import annotations

import datetime as dt
import math
from bisect import bisect_right
from collections.abc import Iterable
from typing import Any, cast

from sqlalchemy import ColumnElement, Connection, Table, case, delete, event, func, literal_column, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker

from app.db.models import UsageLatencyRollup, UsageRecord, UsageRollup

# Latency bins (ms): 0.1 ms to ~10 min, each 2^(1/8) (9%) wider than the last; bin i holds
# [edge i, edge i+1), the first everything below edge 1, the last everything from the last edge.
LATENCY_EDGES = tuple(float(f"{0.1 * 2 ** (i / 8):.6g}") for i in range(181))
KEY = ("hour", "project_id", "key_id", "model", "alias", "operation", "provider", "status")
LATENCY_KEY = ("hour", "project_id", "bin")
HOURLY_DAYS = 2  # today and yesterday keep their hours (the 24-hour page reads them); older days are merged
ROWS_PER_UPSERT = 60  # 12 columns: 720 parameters, under the 999 of the oldest SQLite builds
ROLLUPS = cast(Table, UsageRollup.__table__)
LATENCY = cast(Table, UsageLatencyRollup.__table__)


def latency_bin(value: float) -> int:
    """The bin of a latency, as ``latency_bin_sql`` counts it in the database."""
    return max(0, bisect_right(LATENCY_EDGES, value) - 1)


class Increments:
    """What a set of records adds to the rollups, summed per rollup row."""

    def __init__(self, dialect: str) -> None:
        self._sqlite = dialect == "sqlite"
        self.totals: dict[tuple[Any, ...], list[Any]] = {}
        self.latency: dict[tuple[Any, ...], list[Any]] = {}
        self._hours: dict[Any, dt.datetime] = {}

    def __bool__(self) -> bool:
        return bool(self.totals)

    def hour(self, at: Any) -> dt.datetime:
        """The UTC hour of a record's time as the database buckets it: SQLite keeps the time as text
        (what the ledger writes) and its reports cut the text, zone left off; PostgreSQL in UTC."""
        if not isinstance(at, str):
            if self._sqlite:
                return at.replace(minute=0, second=0, microsecond=0, tzinfo=None)
            at = at.replace(tzinfo=dt.UTC) if at.tzinfo is None else at.astimezone(dt.UTC)
            return at.replace(minute=0, second=0, microsecond=0)
        found = self._hours.get(at[:13])
        if found is None:
            found = self._hours[at[:13]] = dt.datetime.strptime(at[:13], "%Y-%m-%d %H")
        return found

    def add(self, *, at: Any, project_id: int | None, key_id: int | None, operation: str, model: str,
            provider: str | None, status: int, input_tokens: int | None, output_tokens: int | None,
            latency_ms: float, alias: str | None) -> None:
        hour = self.hour(at)
        project = project_id or 0
        key = (hour, project, key_id or 0, model, alias or "", operation, provider or "", status)
        row = self.totals.get(key)
        if row is None:
            self.totals[key] = [1, input_tokens or 0, output_tokens or 0, latency_ms]
        else:
            row[0] += 1
            row[1] += input_tokens or 0
            row[2] += output_tokens or 0
            row[3] += latency_ms
        where = (hour, project, latency_bin(latency_ms))
        seen = self.latency.get(where)
        if seen is None:
            self.latency[where] = [1, latency_ms, latency_ms]
        else:
            seen[0] += 1
            seen[1] = min(seen[1], latency_ms)
            seen[2] = max(seen[2], latency_ms)

    def write(self, connection: Connection) -> None:
        """Add these increments to the rollups, in the connection's transaction."""
        if not self.totals:
            return
        insert = postgresql.insert if connection.dialect.name == "postgresql" else sqlite.insert
        smallest, largest = ((func.least, func.greatest) if connection.dialect.name == "postgresql"
                             else (func.min, func.max))
        totals = [{**dict(zip(KEY, key, strict=True)), "requests": n, "input_tokens": i, "output_tokens": o,
                   "latency_ms": ms} for key, (n, i, o, ms) in sorted(self.totals.items(), key=_order)]
        latency = [{**dict(zip(LATENCY_KEY, key, strict=True)), "requests": n, "low": low, "high": high}
                   for key, (n, low, high) in sorted(self.latency.items(), key=_order)]
        t, h = ROLLUPS, LATENCY
        for start in range(0, len(totals), ROWS_PER_UPSERT):
            stmt = insert(t).values(totals[start:start + ROWS_PER_UPSERT])
            connection.execute(stmt.on_conflict_do_update(index_elements=list(KEY), set_={
                name: t.c[name] + stmt.excluded[name]
                for name in ("requests", "input_tokens", "output_tokens", "latency_ms")}))
        for start in range(0, len(latency), ROWS_PER_UPSERT):
            stmt = insert(h).values(latency[start:start + ROWS_PER_UPSERT])
            connection.execute(stmt.on_conflict_do_update(index_elements=list(LATENCY_KEY), set_={
                "requests": h.c.requests + stmt.excluded.requests,
                "low": smallest(h.c.low, stmt.excluded.low), "high": largest(h.c.high, stmt.excluded.high)}))


def _order(item: tuple[tuple[Any, ...], Any]) -> tuple[Any, ...]:
    return item[0]


def track(sessions: sessionmaker[Session]) -> None:
    """Count the usage records a session made by ``sessions`` adds, in the same flush."""
    event.listen(sessions, "after_flush", _after_flush)


def _after_flush(session: Session, _context: Any) -> None:
    added = [o for o in session.new if isinstance(o, UsageRecord)]
    if not added:
        return
    connection = session.connection()
    increments = Increments(connection.dialect.name)
    for r in added:
        increments.add(at=r.at, project_id=r.project_id, key_id=r.key_id, operation=r.operation, model=r.model,
                       provider=r.provider, status=r.status, input_tokens=r.input_tokens,
                       output_tokens=r.output_tokens, latency_ms=r.latency_ms, alias=r.alias)
    increments.write(connection)


def hour_sql(dialect: str) -> ColumnElement[Any]:
    """A record's UTC hour, in SQL, as ``Increments.hour`` gives it."""
    if dialect == "postgresql":
        return func.timezone(literal_column("'UTC'"), func.date_trunc(
            literal_column("'hour'"), func.timezone(literal_column("'UTC'"), UsageRecord.at)))
    return func.strftime(literal_column("'%Y-%m-%d %H:00:00.000000'"), UsageRecord.at)


def latency_bin_sql(value: Any, dialect: str, low: int = 0, high: int = len(LATENCY_EDGES)) -> ColumnElement[Any]:
    """``latency_bin`` in SQL: a nested CASE, a binary search (eight comparisons a row). The edges
    are written into the SQL; on PostgreSQL as double precision (a bare 0.109051 is numeric)."""
    if high - low == 1:
        return literal_column(str(low))
    middle = (low + high) // 2
    edge = repr(LATENCY_EDGES[middle])
    edge = f"CAST({edge} AS DOUBLE PRECISION)" if dialect == "postgresql" else edge
    return case((value < literal_column(edge), latency_bin_sql(value, dialect, low, middle)),
                else_=latency_bin_sql(value, dialect, middle, high))


def rebuild(connection: Connection, start: dt.datetime, end: dt.datetime) -> int:
    """Replace the rollups of the hours from ``start`` to ``end`` (whole hours, UTC) with the totals
    of the raw records there, in the connection's transaction. Answers the rollup rows written.

    On PostgreSQL the rollup tables are locked against writes (reads go on) until the commit: a
    ledger batch committed between the DELETE and the INSERT would otherwise be counted twice (its
    own increments, and its rows read by the INSERT), or collide with it. The ledger's writes wait
    for that long (its records stay buffered meanwhile): rebuild a day at a time."""
    dialect = connection.dialect.name
    if dialect == "postgresql":
        connection.exec_driver_sql(f"LOCK TABLE {UsageRollup.__tablename__}, {UsageLatencyRollup.__tablename__} "
                                   "IN EXCLUSIVE MODE")
    hour = hour_sql(dialect)
    r = UsageRecord
    window = (r.at >= start, r.at < end)
    t, h = ROLLUPS, LATENCY
    connection.execute(delete(t).where(t.c.hour >= start, t.c.hour < end))
    connection.execute(delete(h).where(h.c.hour >= start, h.c.hour < end))
    # Constants, not parameters: PostgreSQL groups by the expressions only when they are the same.
    zero: ColumnElement[int] = literal_column("0")
    blank: ColumnElement[str] = literal_column("''")
    project = func.coalesce(r.project_id, zero)
    dims = [hour, project, func.coalesce(r.key_id, zero), r.model, func.coalesce(r.alias, blank), r.operation,
            func.coalesce(r.provider, blank), r.status]
    totals = select(*dims, func.count(), func.coalesce(func.sum(r.input_tokens), 0),
                    func.coalesce(func.sum(r.output_tokens), 0), func.sum(r.latency_ms)).where(*window)
    counted = connection.execute(t.insert().from_select(
        [*KEY, "requests", "input_tokens", "output_tokens", "latency_ms"],
        totals.group_by(*dims))).rowcount
    bin_ = latency_bin_sql(r.latency_ms, dialect)
    latency = (select(hour, project, bin_, func.count(), func.min(r.latency_ms), func.max(r.latency_ms))
               .where(*window).group_by(hour, project, bin_))
    connection.execute(h.insert().from_select([*LATENCY_KEY, "requests", "low", "high"], latency))
    return int(counted or 0)


def days(first: dt.date, last: dt.date) -> Iterable[tuple[dt.datetime, dt.datetime]]:
    """Each UTC day from ``first`` to ``last``, as (start, end)."""
    day = first
    while day <= last:
        start = dt.datetime.combine(day, dt.time(), dt.UTC)
        yield start, start + dt.timedelta(days=1)
        day += dt.timedelta(days=1)


def by_the_hour_from(today: dt.date) -> dt.datetime:
    """The first hour kept by the hour: the days before it are merged (``merge_day``)."""
    return dt.datetime.combine(today - dt.timedelta(days=HOURLY_DAYS - 1), dt.time(), dt.UTC)


def _not_midnight(hour: Any, dialect: str) -> ColumnElement[bool]:
    """A rollup's hour that is not its day's 00:00 (the hours are whole: the truncated UTC time)."""
    if dialect == "postgresql":
        return func.extract("hour", func.timezone(literal_column("'UTC'"), hour)) != 0
    return func.strftime(literal_column("'%H'"), hour) != "00"


def next_hourly_day(connection: Connection, since: dt.datetime | None, before: dt.datetime) -> dt.date | None:
    """The first UTC day from ``since`` with rollups of an hour but its first (not merged yet, or
    written to since), before ``before``; None when there is none. Read along the primary key."""
    dialect = connection.dialect.name
    found: list[dt.datetime] = []
    for table in (ROLLUPS, LATENCY):
        query = select(func.min(table.c.hour)).where(table.c.hour < before, _not_midnight(table.c.hour, dialect))
        if since is not None:
            query = query.where(table.c.hour >= since)
        first = connection.execute(query).scalar()
        if first is not None:
            found.append(first.replace(tzinfo=dt.UTC) if first.tzinfo is None else first.astimezone(dt.UTC))
    return min(found).date() if found else None


def merge_day(connection: Connection, start: dt.datetime) -> int:
    """Merge the rollups of the UTC day from ``start`` (its 00:00) into one row per key at ``start``,
    and its latency histogram into one per project and bin, in the connection's transaction:
    idempotent (a merged day is merged again into the same rows). Answers the totals rows left.

    The day's rows are deleted (``RETURNING`` them) and summed here: the same on SQLite (the DELETE
    takes its write lock) and PostgreSQL, where the rollup tables are locked against writes until
    the commit as ``rebuild`` locks them, so a ledger batch waits for the few milliseconds a day's
    rows take instead of adding to a row being replaced. Latencies are summed exactly (``fsum``)."""
    dialect = connection.dialect.name
    if dialect == "postgresql":
        connection.exec_driver_sql(f"LOCK TABLE {UsageRollup.__tablename__}, {UsageLatencyRollup.__tablename__} "
                                   "IN EXCLUSIVE MODE")
    end = start + dt.timedelta(days=1)
    at = start if dialect == "postgresql" else start.replace(tzinfo=None)  # SQLite: the UTC time as text
    t, h = ROLLUPS, LATENCY
    totals: dict[tuple[Any, ...], list[Any]] = {}
    for row in connection.execute(delete(t).where(t.c.hour >= start, t.c.hour < end).returning(
            *(t.c[name] for name in KEY[1:]), t.c.requests, t.c.input_tokens, t.c.output_tokens, t.c.latency_ms)):
        key = tuple(row[:len(KEY) - 1])
        n, i, o, ms = row[len(KEY) - 1:]
        seen = totals.setdefault(key, [0, 0, 0, []])
        seen[0] += n
        seen[1] += i
        seen[2] += o
        seen[3].append(ms)
    latency: dict[tuple[Any, ...], list[Any]] = {}
    histogram = delete(h).where(h.c.hour >= start, h.c.hour < end).returning(
        h.c.project_id, h.c.bin, h.c.requests, h.c.low, h.c.high)
    for project, bin_, n, low, high in connection.execute(histogram):
        bin_seen = latency.get((project, bin_))
        if bin_seen is None:
            latency[(project, bin_)] = [n, low, high]
        else:
            bin_seen[0] += n
            bin_seen[1] = min(bin_seen[1], low)
            bin_seen[2] = max(bin_seen[2], high)
    if totals:
        connection.execute(t.insert(), [
            {**dict(zip(KEY, (at, *key), strict=True)), "requests": n, "input_tokens": i, "output_tokens": o,
             "latency_ms": math.fsum(ms)} for key, (n, i, o, ms) in sorted(totals.items(), key=_order)])
    if latency:
        connection.execute(h.insert(), [
            {"hour": at, "project_id": project, "bin": bin_, "requests": n, "low": low, "high": high}
            for (project, bin_), (n, low, high) in sorted(latency.items(), key=_order)])
    return len(totals)
