"""``last_used_at`` of keys, written in batches off the request path."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging

from app.db.session import Database
from app.tenancy import service as tenancy

log = logging.getLogger("arbiter.touches")


class KeyTouches:
    def __init__(self, database: Database) -> None:
        self._database = database
        self._pending: dict[int, dt.datetime] = {}
        self._lock = asyncio.Lock()  # one writer at a time: a shielded write and the final flush

    def touch(self, key_id: int) -> None:
        if key_id > 0:  # 0: a mesh peer, which has no key here
            self._pending[key_id] = dt.datetime.now(dt.UTC)

    async def flush(self) -> None:
        # The final flush at shutdown waits here for a write the cancelled timer loop left running
        # (its batch already off the buffer), and retries that batch if it failed.
        async with self._lock:
            if not self._pending:
                return
            batch, self._pending = self._pending, {}
            try:
                await asyncio.to_thread(self._write, batch)
            except Exception:
                log.exception("writing last_used_at failed; will retry")
                for key_id, at in batch.items():
                    self._pending.setdefault(key_id, at)

    def _write(self, batch: dict[int, dt.datetime]) -> None:
        with self._database.session() as session:
            tenancy.touch_keys(session, batch)

    async def run(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            await asyncio.shield(self.flush())  # a write in progress completes even at shutdown
