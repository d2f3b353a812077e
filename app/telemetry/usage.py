"""The usage ledger: every decision or chat request of a project, per key and model, written
in batches off the request path and flushed on a clean shutdown, so no record is lost."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import Any

from sqlalchemy import case, func, insert, select
from sqlalchemy.exc import DataError, IntegrityError
from sqlalchemy.orm import Session

from app.db.models import Project, UsageRecord
from app.db.session import Database
from app.telemetry.record import RequestRecord

log = logging.getLogger("arbiter.usage")
BATCH = 5000
MAX_PENDING = 500_000  # records held while the database is away (~250 MB); past it the oldest go


class UsageLedger:
    def __init__(self, database: Database) -> None:
        self._database = database
        self._pending: list[dict[str, Any]] = []
        self._lock = asyncio.Lock()
        self.dropped = 0  # records given up: over MAX_PENDING during an outage, or unwritable

    def add(self, record: RequestRecord) -> None:
        if not record.billable or record.model is None:
            return
        if len(self._pending) >= MAX_PENDING:
            del self._pending[: len(self._pending) - MAX_PENDING + 1]
            self.dropped += 1
            log.error("usage buffer full while the database is away: dropped the oldest record")
        self._pending.append({
            "at": record.at or dt.datetime.now(dt.UTC), "request_id": record.request_id[:64],
            "project_id": record.project_id, "key_id": record.key_id or None,
            "operation": record.operation, "model": record.model[:200], "provider": record.provider,
            "status": record.status, "input_tokens": record.input_tokens or 0,
            "output_tokens": record.output_tokens or 0, "latency_ms": round(record.seconds * 1000, 3),
        })

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def flush(self) -> None:
        async with self._lock:  # one writer at a time: the timer and shutdown may meet
            while self._pending:
                batch, self._pending = self._pending[:BATCH], self._pending[BATCH:]
                try:
                    await asyncio.to_thread(self._write, batch)
                except (DataError, IntegrityError):
                    # Something in the batch cannot be stored at all: write row by row, so one bad
                    # row never blocks every other record behind it.
                    await asyncio.to_thread(self._write_one_by_one, batch)
                except Exception:  # the database is away: keep the records and try again
                    log.exception("writing %d usage records failed; will retry", len(batch))
                    self._pending[:0] = batch
                    return

    def _write(self, batch: list[dict[str, Any]]) -> None:
        with self._database.session() as session:
            session.execute(insert(UsageRecord), batch)

    def _write_one_by_one(self, batch: list[dict[str, Any]]) -> None:
        for row in batch:
            try:
                self._write([row])
            except (DataError, IntegrityError) as exc:
                self.dropped += 1
                log.error("a usage record cannot be stored and is dropped (%s): %s", type(exc).__name__,
                          {k: row[k] for k in ("request_id", "model", "status")})

    async def run(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            # Shielded: cancelling this loop at shutdown must not cancel a write whose batch is
            # already off the buffer (a queued write would be dropped). The final flush waits for
            # it on the lock, then writes the rest.
            await asyncio.shield(self.flush())


def summary(session: Session, *, project: str | None = None, since: dt.date | None = None,
            until: dt.date | None = None) -> list[dict[str, Any]]:
    """Usage per day and per model (and per project when no project is named)."""
    day = func.date(UsageRecord.at)
    columns = [day.label("day"), UsageRecord.model, Project.name.label("project"),
               func.count().label("requests"),
               func.sum(UsageRecord.input_tokens).label("input_tokens"),
               func.sum(UsageRecord.output_tokens).label("output_tokens"),
               func.sum(case((UsageRecord.status >= 400, 1), else_=0)).label("errors"),
               func.avg(UsageRecord.latency_ms).label("mean_latency_ms")]
    query = (select(*columns).outerjoin(Project, Project.id == UsageRecord.project_id)
             .group_by(day, UsageRecord.model, Project.name).order_by(day, UsageRecord.model, Project.name))
    if project is not None:
        query = query.where(Project.name == project)
    if since is not None:
        query = query.where(UsageRecord.at >= dt.datetime.combine(since, dt.time(), dt.UTC))
    if until is not None:
        query = query.where(UsageRecord.at < dt.datetime.combine(until + dt.timedelta(days=1), dt.time(), dt.UTC))
    return [
        {"day": str(row.day), "model": row.model, "project": row.project, "requests": row.requests,
         "input_tokens": int(row.input_tokens or 0), "output_tokens": int(row.output_tokens or 0),
         "errors": int(row.errors or 0), "mean_latency_ms": round(float(row.mean_latency_ms or 0), 3)}
        for row in session.execute(query)
    ]


def recent(session: Session, *, project: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
    query = (select(UsageRecord, Project.name).outerjoin(Project, Project.id == UsageRecord.project_id)
             .order_by(UsageRecord.id.desc()).limit(limit))
    if project is not None:
        query = query.where(Project.name == project)
    return [
        {"at": (r.at if r.at.tzinfo else r.at.replace(tzinfo=dt.UTC)).isoformat(), "request_id": r.request_id,
         "project": name, "key_id": r.key_id, "operation": r.operation, "model": r.model,
         "provider": r.provider, "status": r.status, "input_tokens": r.input_tokens,
         "output_tokens": r.output_tokens, "latency_ms": r.latency_ms}
        for r, name in session.execute(query)
    ]
