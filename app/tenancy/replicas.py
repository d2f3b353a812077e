"""How many replicas share one deployment's rate limits: while Redis is away, each counts
``limit // replicas`` in its own memory (app/tenancy/limits.py).

Each replica keeps a heartbeat row in the ``leases`` table (``replica:<host>:<pid>:<id>``),
renewed every ARBITER_REGISTRY_REFRESH_INTERVAL and counted live until three intervals (at
least LIVE_MIN seconds) have passed without renewal. The database, not Redis, holds them: the
count is wanted exactly when Redis is away. One write and one count per interval per replica,
never on a request's path. With the database away too, the last count stands (1 before any).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import socket
import uuid

from sqlalchemy import delete, func, select
from sqlalchemy.exc import SQLAlchemyError

from app.db.models import Lease, utcnow
from app.db.session import Database

log = logging.getLogger("arbiter.limits")
PREFIX = "replica:"
LIVE_MIN = 10.0  # seconds a heartbeat counts at least (a short interval on a busy machine)
FORGET = dt.timedelta(hours=1)  # rows of replicas gone without a goodbye are deleted after this


class ReplicaCount:
    def __init__(self, database: Database, interval: float) -> None:
        self.name = f"{PREFIX}{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"[:100]
        self.count = 1  # until counted
        self._database = database
        self._interval = interval
        self._live = dt.timedelta(seconds=max(3 * interval, LIVE_MIN))
        self._failing = False

    def beat(self) -> int:
        """Renew this replica's row and count the live ones (this one included)."""
        now = utcnow()
        with self._database.session() as session:
            row = session.get(Lease, self.name)
            if row is None:
                session.add(Lease(name=self.name, holder=self.name, expires_at=now + self._live))
            else:
                row.expires_at = now + self._live
            session.flush()
            live = session.scalar(select(func.count()).select_from(Lease)
                                  .where(Lease.name.startswith(PREFIX), Lease.expires_at > now))
            session.execute(delete(Lease).where(Lease.name.startswith(PREFIX), Lease.expires_at < now - FORGET))
        self.count = max(1, int(live or 0))
        return self.count

    async def run(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self.beat)
                self._failing = False
            except (SQLAlchemyError, OSError) as exc:  # the database away: the last count stands
                if not self._failing:
                    log.warning("could not count replicas (%s); keeping %d", type(exc).__name__, self.count)
                self._failing = True
            await asyncio.sleep(self._interval)

    def release(self) -> None:
        """A replica that stops is no longer counted by the others."""
        with self._database.session() as session:
            session.execute(delete(Lease).where(Lease.name == self.name))
