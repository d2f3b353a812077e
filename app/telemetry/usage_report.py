"""The usage ledger read for reports (the web UI's usage pages): per time bucket (a UTC day, or an
hour of the last 24 hours) tokens and requests by status class, latency percentiles, totals per
project and model, and usage per key.

Every figure is read from the rollups (app/db/rollups.py: per-hour totals kept as the records are
written), aggregated in SQL, the same SQL on SQLite and PostgreSQL: a report costs buckets times
projects, models, keys and statuses, never the number of requests. Latency percentiles come from
the histogram the rollups keep (``LATENCY_EDGES``: bins 9% wide, each with its count, lowest and
highest value), read by ``percentiles``: exact where a bin holds
one or two values, otherwise within the bin, so at most 9% off (a database-side percentile would
need PostgreSQL's ``percentile_cont`` and a second, different path for SQLite, which has none).
Reports run on a pool of their own with a statement timeout (app/db/reports.py)."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, Select, case, func, literal_column, select, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from app.db.models import ApiKey, Project, UsageLatencyRollup, UsageRecord, UsageRollup
from app.db.rollups import LATENCY_EDGES
from app.db.timestamps import as_utc, iso
from app.errors import BackendFailed

T = TypeVar("T")
S = TypeVar("S", bound=Select[*tuple[Any, ...]])
REPORT_TIMEOUT_MS = 20_000
QUERY_CANCELED = "57014"  # PostgreSQL's SQLSTATE for a statement stopped by statement_timeout
__all__ = ["LATENCY_EDGES"]  # the latency bins (app/db/rollups.py), as the charts read them
STATUS_CLASSES = ("2xx", "3xx", "4xx", "5xx", "other")


@dataclass(frozen=True)
class Period:
    """A report's window, in UTC: ``start`` included, ``end`` not; by the day or by the hour."""

    start: dt.datetime
    end: dt.datetime
    hourly: bool

    @classmethod
    def last(cls, days: int, now: dt.datetime | None = None) -> Period:
        """``days`` whole UTC days up to today; a single day is the last 24 hours, by the hour
        (this hour included)."""
        now = (now or dt.datetime.now(dt.UTC)).astimezone(dt.UTC)
        if days == 1:
            hour = now.replace(minute=0, second=0, microsecond=0)
            return cls(hour - dt.timedelta(hours=23), hour + dt.timedelta(hours=1), True)
        today = dt.datetime.combine(now.date(), dt.time(), dt.UTC)
        return cls(today - dt.timedelta(days=days - 1), today + dt.timedelta(days=1), False)

    @property
    def step(self) -> dt.timedelta:
        return dt.timedelta(hours=1) if self.hourly else dt.timedelta(days=1)

    def buckets(self) -> list[str]:
        """Every bucket's label, oldest first, as ``bucket`` gives them: 2025-03-01 or 2025-03-01 14:00."""
        labels, at = [], self.start
        while at < self.end:
            labels.append(at.strftime("%Y-%m-%d %H:00" if self.hourly else "%Y-%m-%d"))
            at += self.step
        return labels

    @property
    def first_day(self) -> dt.date:
        return self.start.date()

    @property
    def last_day(self) -> dt.date:
        return (self.end - dt.timedelta(microseconds=1)).date()


def reading(work: Callable[[Session], T]) -> Callable[[Session], T]:
    """``work`` as a report on a session of the caller's: its statements stopped after
    ``REPORT_TIMEOUT_MS`` on PostgreSQL, and a stopped one told as such (504, what to do), not as
    a database that is away. The app's reports run on the report pool instead (app/db/reports.py,
    ``Components.in_report``), which does this with ARBITER_REPORT_TIMEOUT_SECONDS."""
    def bounded(session: Session) -> T:
        limit(session, REPORT_TIMEOUT_MS)
        with translated():
            return work(session)
    return bounded


def limit(session: Session, milliseconds: int) -> None:
    """The statement timeout of the rest of this transaction (PostgreSQL; SQLite has none)."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text(f"SET LOCAL statement_timeout = {int(milliseconds)}"))


@contextmanager
def translated() -> Iterator[None]:
    try:
        yield
    except OperationalError as exc:
        if getattr(exc.orig, "sqlstate", None) != QUERY_CANCELED:
            raise
        raise BackendFailed(504, f"The usage query ran longer than {REPORT_TIMEOUT_MS // 1000} s and was "
                                 "stopped; choose a shorter period, one project or one key.") from exc


def bucket(session: Session, hourly: bool, at: Any = UsageRollup.hour) -> ColumnElement[Any]:
    """A rollup's (or a record's) UTC day or hour, in SQL; ``label`` names it. PostgreSQL truncates
    the UTC time (its own conversion would use the session's TimeZone); SQLite keeps the UTC time
    as text, and gives the label itself."""
    if session.get_bind().dialect.name == "postgresql":
        unit = "'hour'" if hourly else "'day'"
        return func.date_trunc(literal_column(unit), func.timezone(literal_column("'UTC'"), at))
    return func.strftime(literal_column("'%Y-%m-%d %H:00'" if hourly else "'%Y-%m-%d'"), at)


def label(value: Any, hourly: bool) -> str:
    """A bucket as ``Period.buckets`` names it (2025-03-01, 2025-03-01 14:00), from ``bucket``'s value."""
    if isinstance(value, dt.datetime | dt.date):
        return value.strftime("%Y-%m-%d %H:00" if hourly else "%Y-%m-%d")
    return str(value)


def project_ids(session: Session, project: str | None, projects: Collection[str] | None) -> list[int] | None:
    """The ids of ``project`` among ``projects`` (a project-admin's), or None for every project
    (and what no project owns any more): reports filter on the id, and its index."""
    if project is None and projects is None:
        return None
    names = {project} if project is not None else set(projects or ())
    if projects is not None:
        names &= set(projects)
    if not names:
        return []
    return sorted(session.scalars(select(Project.id).where(Project.name.in_(sorted(names)))))


def scoped(query: S, period: Period | None, project: str | None, projects: Collection[str] | None,
           session: Session | None = None) -> S:
    """``query`` over the raw ledger (joined to its project) kept to ``period``, ``project`` and the
    ``projects`` a project-admin sees (None: every project, and records of deleted projects). With
    ``session``, the projects are found first and the rows by their project's id (its index)."""
    query = query.select_from(UsageRecord).outerjoin(Project, Project.id == UsageRecord.project_id)
    if period is not None:
        query = query.where(UsageRecord.at >= period.start, UsageRecord.at < period.end)
    if session is not None:
        ids = project_ids(session, project, projects)
        return query if ids is None else query.where(UsageRecord.project_id.in_(ids))
    if project is not None:
        query = query.where(Project.name == project)
    if projects is not None:
        query = query.where(Project.name.in_(sorted(projects)))
    return query


def rolled(session: Session, query: S, start: dt.datetime | None, end: dt.datetime | None,
           project: str | None, projects: Collection[str] | None, table: Any = UsageRollup) -> S:
    """``query`` over the rollups (``table``, joined to their project) from ``start`` to ``end``,
    kept to ``project`` and ``projects`` as ``scoped`` keeps the records."""
    query = query.select_from(table).outerjoin(Project, Project.id == table.project_id)
    if start is not None:
        query = query.where(table.hour >= start)
    if end is not None:
        query = query.where(table.hour < end)
    ids = project_ids(session, project, projects)
    return query if ids is None else query.where(table.project_id.in_(ids))


def _class_counts() -> list[Any]:
    status, n = UsageRollup.status, UsageRollup.requests
    ranges = {"2xx": (200, 299), "3xx": (300, 399), "4xx": (400, 499), "5xx": (500, 599)}
    counts = [func.sum(case((status.between(low, high), n), else_=0)).label(f"s{name}")
              for name, (low, high) in ranges.items()]
    counts.append(func.sum(case((status.between(200, 599), 0), else_=n)).label("sother"))
    return counts


def _sums() -> list[Any]:
    r = UsageRollup
    return [func.sum(r.requests).label("requests"), func.sum(r.input_tokens).label("input_tokens"),
            func.sum(r.output_tokens).label("output_tokens")]


def mean_latency(row: Any, digits: int) -> float:
    """The mean latency of a group of rollups: the sum of their latencies over their requests."""
    return round(float(row.latency_ms or 0) / int(row.requests), digits) if row.requests else 0.0


def series(session: Session, period: Period, *, project: str | None = None,
           projects: Collection[str] | None = None) -> list[dict[str, Any]]:
    """Per bucket and model: requests, tokens, and requests per status class (``STATUS_CLASSES``)."""
    at = bucket(session, period.hourly)
    query = rolled(session, select(at.label("bucket"), UsageRollup.model, *_sums(), *_class_counts()),
                   period.start, period.end, project, projects).group_by(at, UsageRollup.model)
    return [{"bucket": label(row.bucket, period.hourly), "model": row.model, "requests": int(row.requests),
             "input_tokens": int(row.input_tokens or 0), "output_tokens": int(row.output_tokens or 0),
             "statuses": {name: int(getattr(row, f"s{name}") or 0) for name in STATUS_CLASSES}}
            for row in session.execute(query)]


def totals(session: Session, period: Period, *, project: str | None = None,
           projects: Collection[str] | None = None) -> list[dict[str, Any]]:
    """Per project and model over the period: requests, tokens, errors (4xx and 5xx), mean latency."""
    r = UsageRollup
    query = rolled(session, select(Project.name.label("project"), r.model, *_sums(),
                                   func.sum(case((r.status >= 400, r.requests), else_=0)).label("errors"),
                                   func.sum(r.latency_ms).label("latency_ms")),
                   period.start, period.end, project, projects).group_by(Project.name, r.model)
    rows = [{"project": row.project, "model": row.model, "requests": int(row.requests),
             "input_tokens": int(row.input_tokens or 0), "output_tokens": int(row.output_tokens or 0),
             "errors": int(row.errors or 0), "mean_latency_ms": mean_latency(row, 1)}
            for row in session.execute(query)]
    return sorted(rows, key=lambda r: (r["project"] is None, r["project"] or "", r["model"]))


def totals_per_bucket(session: Session, period: Period, *, project: str | None = None,
                      projects: Collection[str] | None = None) -> list[dict[str, Any]]:
    """Per bucket, project and model (the totals' CSV): requests, tokens, the status classes and
    the mean latency; oldest first."""
    at = bucket(session, period.hourly)
    r = UsageRollup
    query = rolled(session, select(at.label("bucket"), Project.name.label("project"), r.model, *_sums(),
                                   *_class_counts(), func.sum(r.latency_ms).label("latency_ms")),
                   period.start, period.end, project, projects).group_by(at, Project.name, r.model)
    rows = [{"bucket": label(row.bucket, period.hourly), "project": row.project, "model": row.model,
             "requests": int(row.requests),
             "input_tokens": int(row.input_tokens or 0), "output_tokens": int(row.output_tokens or 0),
             **{name: int(getattr(row, f"s{name}") or 0) for name in STATUS_CLASSES},
             "mean_latency_ms": mean_latency(row, 3)}
            for row in session.execute(query)]
    return sorted(rows, key=lambda r: (r["bucket"], r["project"] or "", r["model"]))


def latency_bins(session: Session, period: Period, *, project: str | None = None,
                 projects: Collection[str] | None = None) -> dict[str, list[tuple[int, int, float, float]]]:
    """Per bucket, the latency histogram: (bin, count, lowest, highest) of every bin that has values."""
    h = UsageLatencyRollup
    at = bucket(session, period.hourly, h.hour)
    query = rolled(session, select(at.label("bucket"), h.bin, func.sum(h.requests).label("n"),
                                   func.min(h.low).label("low"), func.max(h.high).label("high")),
                   period.start, period.end, project, projects, h).group_by(at, h.bin)
    found: dict[str, list[tuple[int, int, float, float]]] = {}
    for row in session.execute(query):
        found.setdefault(label(row.bucket, period.hourly), []).append(
            (int(row.bin), int(row.n), float(row.low), float(row.high)))
    return found


def percentiles(bins: Iterable[tuple[int, int, float, float]],
                wanted: tuple[float, ...] = (0.5, 0.95)) -> dict[float, float] | None:
    """The nearest-rank percentiles of a histogram (``latency_bins``' tuples, in any order, the
    same bin more than once when merged from several buckets); None when it holds nothing. The
    value of rank k is placed between its bin's lowest and highest value, geometrically (the bins
    are): exact for a bin of one or two values, within the bin's 9% otherwise."""
    merged: dict[int, tuple[int, float, float]] = {}
    for index, count, low, high in bins:
        seen = merged.get(index)
        merged[index] = (count, low, high) if seen is None else (seen[0] + count, min(seen[1], low),
                                                                 max(seen[2], high))
    ordered = [merged[index] for index in sorted(merged)]
    size = sum(count for count, _, _ in ordered)
    if size == 0:
        return None
    found: dict[float, float] = {}
    for q in wanted:
        rank = max(1, math.ceil(q * size))  # the rank-th smallest value, 1-based
        before = 0
        for count, low, high in ordered:
            if before + count >= rank:
                found[q] = _within(count, rank - before, low, high)
                break
            before += count
    return found


def _within(count: int, position: int, low: float, high: float) -> float:
    if count <= 1 or high <= low:
        return low
    share = (position - 1) / (count - 1)
    if low <= 0:
        return low + (high - low) * share
    return float(low * (high / low) ** share)


def per_key(session: Session, period: Period, project: str) -> list[dict[str, Any]]:
    """Every key of ``project`` with its usage over the period (requests, tokens, errors, 429s,
    mean latency) and its last use, busiest first; usage whose key is gone has ``key_id`` None.
    A key is shown by its name, prefix and last four characters: never more of it."""
    found = session.scalars(select(Project).where(Project.name == project)).first()
    if found is None:
        return []
    r = UsageRollup
    usage = (select(r.key_id, *_sums(),
                    func.sum(case((r.status >= 400, r.requests), else_=0)).label("errors"),
                    func.sum(case((r.status == 429, r.requests), else_=0)).label("rate_limited"),
                    func.sum(r.latency_ms).label("latency_ms"))
             .where(r.project_id == found.id, r.hour >= period.start, r.hour < period.end)
             .group_by(r.key_id))
    counted = {row.key_id or None: row for row in session.execute(usage)}  # 0: no key (gone since)
    keys = session.scalars(select(ApiKey).where(ApiKey.project_id == found.id).order_by(ApiKey.id))
    rows = [_key_row(key.id, key, counted.pop(key.id, None)) for key in keys]
    rows += [_key_row(key_id, None, row) for key_id, row in counted.items()]  # keys gone since
    return sorted(rows, key=lambda r: (-r["requests"], r["key_id"] is None, r["key_id"] or 0))


def _key_row(key_id: int | None, key: ApiKey | None, usage: Any) -> dict[str, Any]:
    now = dt.datetime.now(dt.UTC)

    def passed(moment: dt.datetime | None) -> bool:
        return moment is not None and as_utc(moment) <= now
    state = ("revoked" if key is not None and passed(key.revoked_at) else
             "expired" if key is not None and passed(key.expires_at) else "active" if key is not None else "gone")
    return {"key_id": key_id, "name": key.name if key else "",
            "shown": f"{key.prefix}…{key.last_four}" if key else "", "state": state,
            "last_used_at": iso(key.last_used_at) if key else None,
            "requests": int(usage.requests or 0) if usage else 0,
            "input_tokens": int(usage.input_tokens or 0) if usage else 0,
            "output_tokens": int(usage.output_tokens or 0) if usage else 0,
            "errors": int(usage.errors or 0) if usage else 0,
            "rate_limited": int(usage.rate_limited or 0) if usage else 0,
            "mean_latency_ms": mean_latency(usage, 1) if usage else None}
