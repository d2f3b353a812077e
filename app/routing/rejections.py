"""Services whose backend refused Arbiter's own credential on a forwarded request.

SPEC §1: the tenant gets 500 ``upstream_auth_error`` "and the service status says so". The
forwarding path only tells (``Registry.note_credential_rejected``); this writes the service's
``last_error`` off the request path, at most once per service every ``EVERY`` seconds, so a storm
of refused requests costs one write. The next successful read of the service (a sync, a Refresh,
a new key) clears it; a write that arrives after such a read is dropped.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time

from app.db.models import Service, utcnow
from app.db.session import Database
from app.db.timestamps import as_utc

log = logging.getLogger("arbiter.services")
EVERY = 10.0  # seconds between writes for one service


class RejectedCredentials:
    def __init__(self, database: Database) -> None:
        self._database = database
        self._written: dict[int, float] = {}  # service id -> when this process last wrote it
        self._pending: set[asyncio.Task[None]] = set()

    def note(self, service_id: int, url: str) -> None:
        """Called on the event loop, on the request path: never waits."""
        now = time.monotonic()
        if service_id <= 0 or now - self._written.get(service_id, -EVERY) < EVERY:
            return  # a mesh route (the mesh's own status says so), or written a moment ago
        self._written[service_id] = now
        message = (f"{url} rejected Arbiter's credential on a forwarded request (tenants get 500 "
                   "upstream_auth_error); update the service's api_key")
        task = asyncio.get_running_loop().create_task(self._write(service_id, message, utcnow()))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _write(self, service_id: int, message: str, at: dt.datetime) -> None:
        try:
            await asyncio.to_thread(self._store, service_id, message, at)
        except Exception:  # the database may be away: the log line below the forwarder's stays
            log.warning("could not record the rejected credential of service %s", service_id, exc_info=True)

    def _store(self, service_id: int, message: str, at: dt.datetime) -> None:
        with self._database.session() as session:
            service = session.get(Service, service_id)
            if service is None or (service.last_sync_at is not None and as_utc(service.last_sync_at) >= at):
                return  # gone, or read again since: that read knows better
            service.last_error = message

    async def aclose(self) -> None:
        await asyncio.gather(*self._pending, return_exceptions=True)
