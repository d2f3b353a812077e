"""``arbiter_usage_spool_records`` and ``arbiter_usage_spool_bytes``: the usage spool's files.

Records wait in ``ARBITER_USAGE_SPOOL_DIR`` (app/telemetry/spool.py) when a process left them
there (a shutdown with the database away, a crash, a kill) and no start has loaded them yet, and
while a start that loaded a file has not written all of it (``*.loading``). Those are the records
counted; a running replica's own journal is not (its records are in its memory, normally written
within a second: ``arbiter_usage_journal_records`` counts them, each replica its own). The bytes
are those of every spool file, journals included: what the volume holds. This replica looks once
its start has loaded what it could, then every ``EVERY`` seconds in a worker thread, and once more
after its own shutdown. A file is read (its lines counted) only when it is new or changed, never
on a scrape: a scrape reads the last count. 0 records is the normal state.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from app.telemetry.spool import live_owners, owner_of

log = logging.getLogger("arbiter.usage")
EVERY = 30.0  # seconds between two looks at the spool directory
PREFIX = "arbiter-usage-spool-"
# Not yet loaded (``.part``: an older release's, cut short); claimed by a start writing it; a journal.
WAITING = (".jsonl", ".part", ".loading", ".journal")


class SpoolWatch:
    def __init__(self, directory: Path | None, mine: str = "") -> None:
        self._directory = directory
        self._mine = mine  # this process's owner name in the spool (its journal is not waiting)
        # File name -> ((size, mtime), records) as last counted: a file is read once per change.
        self._counted: dict[str, tuple[tuple[int, int], int]] = {}
        self.waiting = 0
        self.bytes = 0

    def look(self) -> int:
        """Count the records waiting now (blocking: run it in a worker thread)."""
        directory = self._directory
        counted: dict[str, tuple[tuple[int, int], int]] = {}
        try:
            paths = list(directory.iterdir()) if directory is not None and directory.is_dir() else []
        except OSError as exc:  # unreadable: nothing known to wait there; said once per look
            log.warning("the usage spool directory %s cannot be listed: %s", directory, exc)
            paths = []
        paths = [path for path in paths if path.name.startswith(PREFIX)]
        journals = [path.name for path in paths if path.name.endswith(".journal")]
        running = live_owners(directory, journals, self._mine) if directory is not None and journals else set()
        size = 0
        for path in paths:
            try:
                stat = path.stat()
            except OSError:  # loaded (and removed) since the listing
                continue
            size += stat.st_size
            if not path.name.endswith(WAITING) or path.name.endswith(".journal") and owner_of(path.name) in running:
                continue
            version = (stat.st_size, stat.st_mtime_ns)
            known = self._counted.get(path.name)
            counted[path.name] = (version, known[1] if known is not None and known[0] == version else _records(path))
        self._counted = counted
        self.waiting = sum(records for _, records in counted.values())
        self.bytes = size
        return self.waiting

    async def run(self, interval: float = EVERY) -> None:
        """Look every ``interval`` seconds (a background task of the app)."""
        while True:
            await asyncio.sleep(interval)
            try:
                await asyncio.to_thread(self.look)
            except Exception:  # never let the watch die: the last count stays
                log.exception("counting the usage spool's records failed; trying again in %.0f s", interval)


def _records(path: Path) -> int:
    """The records a spool file holds: its whole non-blank lines, read as bytes (a file that is not
    UTF-8, or not JSON, is counted all the same: its records wait too; a last line cut short is
    not a record); 0 once it is gone."""
    try:
        with path.open("rb") as spool:
            return sum(1 for line in spool if line.strip() and line.endswith(b"\n"))
    except OSError:
        return 0
