"""``arbiter_usage_spool_records``: the usage records waiting in the spool directory's files.

A shutdown with the database away keeps its records in ``ARBITER_USAGE_SPOOL_DIR``
(app/telemetry/usage.py), and a start loads them. Until one does they wait there; so do the
records of a file a start could not read (left as ``*.loading``). This replica counts them where
it can see them: its own directory, looked at once its start has loaded what it could, then
every ``EVERY`` seconds in a worker thread, and once more after its own shutdown kept some. A
file is read (its lines counted) only when it is new or changed, never on a scrape: a scrape
reads the last count. 0 is the normal state.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

log = logging.getLogger("arbiter.usage")
EVERY = 30.0  # seconds between two looks at the spool directory
PREFIX = "arbiter-usage-spool-"
WAITING = (".jsonl", ".loading")  # not yet loaded; claimed by a start that could not read it (or is)


class SpoolWatch:
    def __init__(self, directory: Path | None) -> None:
        self._directory = directory
        # File name -> ((size, mtime), records) as last counted: a file is read once per change.
        self._counted: dict[str, tuple[tuple[int, int], int]] = {}
        self.waiting = 0

    def look(self) -> int:
        """Count the records waiting now (blocking: run it in a worker thread)."""
        directory = self._directory
        counted: dict[str, tuple[tuple[int, int], int]] = {}
        try:
            paths = list(directory.iterdir()) if directory is not None and directory.is_dir() else []
        except OSError as exc:  # unreadable: nothing known to wait there; said once per look
            log.warning("the usage spool directory %s cannot be listed: %s", directory, exc)
            paths = []
        for path in paths:
            if not path.name.startswith(PREFIX) or not path.name.endswith(WAITING):
                continue
            try:
                stat = path.stat()
            except OSError:  # loaded (and removed) since the listing
                continue
            version = (stat.st_size, stat.st_mtime_ns)
            known = self._counted.get(path.name)
            counted[path.name] = (version, known[1] if known is not None and known[0] == version else _records(path))
        self._counted = counted
        self.waiting = sum(records for _, records in counted.values())
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
    """The records a spool file holds: its non-blank lines, read as bytes (a file that is not
    UTF-8, or not JSON, is counted all the same: its records wait too); 0 once it is gone."""
    try:
        with path.open("rb") as spool:
            return sum(1 for line in spool if line.strip())
    except OSError:
        return 0
