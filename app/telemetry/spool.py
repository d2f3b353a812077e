"""The usage spool (``ARBITER_USAGE_SPOOL_DIR``): a journal of this process's usage records, and
the recovery at start-up of what other processes left there.

**The journal.** With a spool directory set, every record the ledger buffers is also appended to
this process's journal: ``add`` only puts it in a queue (no file call, no await); a writer thread
writes what came every ``ARBITER_USAGE_FSYNC_INTERVAL`` seconds (0.1) and fsyncs it, so a SIGKILL
loses at most that window. ``ARBITER_USAGE_DURABLE=always`` has the answer wait for the fsync (the
writer runs at once, one fsync for every request waiting: a group commit). Once a batch is in the
database the ledger says so (``confirm``); a segment whose every record is there is emptied, or
deleted when it was full (``SEGMENT_BYTES``). A record dropped from memory while the database is
away (over the ledger's bound) stays in its segment, which is then kept for the next start.

**Files**, all named ``arbiter-usage-spool-*`` (``OWNER`` is ``<pid>-<random>``, one a process):

- ``<OWNER>.lock``: held (flock) by its process while it runs; a process it can be taken from is dead;
- ``<OWNER>-<n>.journal``: its journal's segments, JSON lines (``COLUMNS`` of usage.py, the uid last);
- ``<anything>.<OWNER>.loading``: a file a start claimed (by renaming it: one claimant) and loaded,
  kept until each of its records is in the database;
- ``<pid>-<random>.jsonl`` / ``.part``: spool files of earlier releases (``.part``: cut short).

**Recovery** (``recover``): every file whose owner is dead (its lock free, or no lock at all) is
claimed and read; whole lines are records, a line cut short at the end (a crash or a full disk
in the middle of a write) is left out, a line that cannot be read is counted as dropped, and a
file with no record is removed. Two replicas sharing the directory never take each other's live
files, and never both take one file.

**A full disk** (ENOSPC, or any write error): what was written stays, a record cut in the middle
is truncated away, and the rest waits in memory (the ledger's buffer, bounded) for the next try,
every interval; nothing already on disk is lost, and nothing is dropped but what the bound drops.
"""

from __future__ import annotations

import asyncio
import bisect
import datetime as dt
import errno
import fcntl
import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("arbiter.usage")
PREFIX = "arbiter-usage-spool-"
SEGMENT_BYTES = 8 << 20  # a segment this big is closed, and a new one begun: it can go once all of it is written
STALE_PART = 60.0  # seconds: an older release's ``.part`` younger than this may still be being written
ERROR_LOG_EVERY = 60.0  # seconds between two log lines about failing spool writes
UID_PREFIX = 20  # hex digits of a process's random uid prefix; the 12 after it are the record's number
_write = os.write  # the one call that puts bytes in a segment (a test makes it fail as a full disk does)
_fsync = os.fsync


def encode(row: tuple[Any, ...]) -> bytes:
    at = row[0]
    return (json.dumps([at.isoformat() if isinstance(at, dt.datetime) else at, *row[1:]]) + "\n").encode()


@dataclass
class _Segment:
    path: Path
    fd: int
    first: int  # the number of its first record
    records: int = 0  # records in it
    done: int = 0  # of those, in the database
    size: int = 0  # bytes, all whole records
    full: bool = False  # no more records go in


@dataclass
class _Claimed:
    path: Path
    left: int  # records not yet in the database


@dataclass
class Recovered:
    """What ``recover`` found: the records (uids kept) and how many lines could not be read."""
    rows: list[list[Any]] = field(default_factory=list)
    unreadable: int = 0
    files: int = 0


def _owner_alive(directory: Path, owner: str, mine: str) -> tuple[bool, int | None]:
    """Whether the process ``owner`` runs (its lock is held). When it is dead and its lock file
    exists, answers that file's descriptor, locked: held until its files are claimed."""
    if owner == mine:
        return True, None
    try:
        fd = os.open(directory / f"{PREFIX}{owner}.lock", os.O_RDWR)
    except FileNotFoundError:
        return False, None
    except OSError:
        return True, None  # cannot tell: left alone
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return True, None
    return False, fd


def owner_of(name: str) -> str | None:
    """The owner a spool file's name says (a journal's writer, or a loading file's claimant)."""
    if name.endswith(".loading"):
        return name[:-len(".loading")].rsplit(".", 1)[-1]
    if name.endswith(".journal"):
        return name[len(PREFIX):-len(".journal")].rsplit("-", 1)[0]
    return None


def live_owners(directory: Path, names: Iterable[str], mine: str = "") -> set[str]:
    """The owners among ``names`` whose process runs (the others' files are waiting to be loaded)."""
    alive = set()
    for owner in {owner_of(name) for name in names} - {None}:
        assert owner is not None
        live, fd = _owner_alive(directory, owner, mine)
        if fd is not None:
            os.close(fd)
        if live:
            alive.add(owner)
    return alive


class Journal:
    """This process's journal in ``directory``, and the files it claimed at start-up."""

    def __init__(self, directory: Path, *, journaling: bool = True, interval: float = 0.1, always: bool = False,
                 on_fsync: Callable[[float], Any] | None = None,
                 on_error: Callable[[], Any] | None = None) -> None:
        self.directory = directory
        self.journaling = journaling  # every record as it comes; else only what a shutdown is left with
        self.interval = interval
        self.always = always
        self.owner = f"{os.getpid()}-{os.urandom(4).hex()}"
        self.uid_prefix = os.urandom(UID_PREFIX // 2).hex()
        self._on_fsync = on_fsync  # arbiter_usage_spool_fsync_seconds
        self._on_error = on_error  # arbiter_usage_spool_write_errors_total
        self._lock_fd: int | None = None
        self._next = 0  # the number the next record gets (loop thread)
        # Loop -> writer: records to write, uids now in the database, and waiters (always).
        self._queue: deque[tuple[Any, ...]] = deque()
        self._confirmed: deque[str] = deque()
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        # The writer's own (one thread at a time: ``_mutex``).
        self._mutex = threading.Lock()
        self._taken = 0  # records taken from the queue so far (their numbers are below it)
        self._unwritten: dict[int, tuple[Any, ...]] = {}  # taken, not on disk yet (a failed write)
        self._early: set[int] = set()  # in the database before they were taken: not worth writing
        self._segments: list[_Segment] = []
        self._firsts: list[int] = []  # each segment's first number, for bisect
        self._claimed: dict[str, _Claimed] = {}  # uid of a loaded record -> the file it came from
        self._serial = 0
        self.written = 0  # records on disk, first to last (read by the ledger, from the loop)
        self.failing = False
        self._logged_at = -ERROR_LOG_EVERY
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None

    # -- start and stop -----------------------------------------------------------------------

    def open(self) -> None:
        """Take this process's lock (blocking: a worker thread). Once: later calls do nothing."""
        if self._lock_fd is not None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory / f"{PREFIX}{self.owner}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._lock_fd = fd

    def start(self) -> None:
        """The writer thread (a daemon: a process that exits without ``close`` leaves its files)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="arbiter-usage-spool", daemon=True)
            self._thread.start()

    def close(self) -> int:
        """Stop the writer, write and fsync what is left, and answer how many records could not
        be written (the disk full): they are lost with the process. Files holding records not
        in the database stay for the next start; the others go, and the lock with them."""
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        with self._mutex:
            self._tick()
            lost = len(self._unwritten)
            self._unwritten.clear()
            kept = 0
            for segment in self._segments:
                os.close(segment.fd)
                if segment.done >= segment.records:
                    _unlink(segment.path)
                else:
                    kept += segment.records - segment.done
            self._segments, self._firsts = [], []
            kept += sum(1 for _ in self._claimed)
            if self._lock_fd is not None:
                if not kept:  # nothing of this process left: its lock goes too
                    _unlink(self.directory / f"{PREFIX}{self.owner}.lock")
                os.close(self._lock_fd)
                self._lock_fd = None
        return lost

    # -- the loop's side ----------------------------------------------------------------------

    def uid(self) -> str:
        """The uid of the next record, which must then be ``append``-ed (loop thread)."""
        number, self._next = self._next, self._next + 1
        return f"{self.uid_prefix}{number:012x}"

    def append(self, row: tuple[Any, ...]) -> None:
        self._queue.append(row)

    def confirm(self, rows: Iterable[tuple[Any, ...]]) -> None:
        """These rows are in the database (any thread)."""
        self._confirmed.extend(row[-1] for row in rows)

    async def synced(self) -> None:
        """Wait until every record appended so far is written and fsynced (or failed to be: a
        full disk never holds an answer; the record waits in memory as any other)."""
        future = asyncio.get_running_loop().create_future()
        self._waiters.append((self._next, future))
        self._wake.set()
        await future

    def holds(self, uid: Any) -> bool:
        """Whether the record of ``uid`` is on disk here (in a segment, or a claimed file): dropped from memory,
        it is still written by the next start. A guess on the safe side: a row being written now
        counts as not there."""
        if not isinstance(uid, str):
            return False
        if not uid.startswith(self.uid_prefix):
            return uid in self._claimed
        number = int(uid[UID_PREFIX:], 16)
        return number < self._taken and number not in self._unwritten and number not in self._early

    def pending_records(self) -> int:
        """Records on disk in this journal and claimed files not yet in the database."""
        return (sum(s.records - s.done for s in self._segments) + len(self._claimed))

    # -- recovery -----------------------------------------------------------------------------

    def recover(self) -> Recovered:
        """Claim and read what dead processes left (blocking: a worker thread at start-up)."""
        found = Recovered()
        if not self.directory.is_dir():
            return found
        try:
            names = sorted(path.name for path in self.directory.iterdir() if path.name.startswith(PREFIX))
        except OSError as exc:
            log.error("the usage spool directory %s cannot be listed: %s", self.directory, exc)
            return found
        dead: dict[str, int | None] = {}
        seen: set[str] = set()
        now = time.time()
        for name in names:
            if name.endswith(".lock"):
                continue
            owner = owner_of(name)
            if owner is not None:
                if owner not in dead:
                    alive, fd = _owner_alive(self.directory, owner, self.owner)
                    if alive:
                        continue
                    dead[owner] = fd
            elif name.endswith(".part"):
                try:
                    if now - (self.directory / name).stat().st_mtime < STALE_PART:
                        continue  # an older release may be writing it right now
                except OSError:
                    continue
            elif not name.endswith(".jsonl"):
                continue
            self.open()  # this process's lock before the first claim: its claimed files are its own
            self._claim(name, found, seen)
        for owner, fd in dead.items():  # its files are claimed: its lock goes
            _unlink(self.directory / f"{PREFIX}{owner}.lock")
            if fd is not None:
                os.close(fd)
        return found

    def _claim(self, name: str, found: Recovered, seen: set[str]) -> None:
        base = name[:-len(".loading")].rsplit(".", 1)[0] if name.endswith(".loading") else name
        claimed = self.directory / f"{base}.{self.owner}.loading"
        try:
            (self.directory / name).rename(claimed)
        except OSError:  # another process took it
            return
        try:
            data = claimed.read_bytes()
        except OSError as exc:
            log.error("usage spool %s cannot be read (%s): left for the next start", claimed.name, exc)
            return
        lines = data.split(b"\n")
        if lines[-1]:
            log.warning("usage spool %s ends in a record cut short (%d bytes): left out", base, len(lines[-1]))
            found.unreadable += 1
        entry = _Claimed(claimed, 0)
        for line in lines[:-1]:
            if not line.strip():
                continue
            try:
                values = json.loads(line)
                if not isinstance(values, list) or not values or not isinstance(values[-1], str):
                    raise ValueError("not a spooled row")
            except ValueError:
                found.unreadable += 1
                continue
            uid = values[-1]
            if uid in seen:  # in two files: written once, counted for the first
                continue
            seen.add(uid)
            found.rows.append(values)
            self._claimed[uid] = entry
            entry.left += 1
        if entry.left == 0:
            _unlink(claimed)
        else:
            found.files += 1

    def forget(self, uid: str) -> None:
        """A loaded row that cannot be used (``_from_spool`` refused it): its file need not wait for it."""
        self._confirmed.append(uid)

    # -- the writer ---------------------------------------------------------------------------

    def sync_now(self) -> None:
        """One write of the writer, in this thread (blocking: tools and tests)."""
        with self._mutex:
            self._tick()

    def _run(self) -> None:
        while not self._stop:
            if not self._queue and not self._waiters:
                self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop:
                break
            started = time.monotonic()
            with self._mutex:
                try:
                    self._tick()
                except Exception:  # never let the writer die: what is not written stays in memory
                    log.exception("the usage spool writer failed; it goes on")
            if not self.always and not self._waiters:
                # One write an interval, whatever comes: the interval is the bound, not a delay.
                left = self.interval - (time.monotonic() - started)
                if left > 0 and not self._stop:
                    self._wake.wait(left)

    def _tick(self) -> None:
        waiting = len(self._waiters)
        rows: list[tuple[int, tuple[Any, ...]]] = []
        while self._queue:
            rows.append((self._taken, self._queue.popleft()))
            self._taken += 1
        self._apply_confirmed()
        for number, row in rows:
            if number in self._early:
                self._early.discard(number)
            else:
                self._unwritten[number] = row
        if self._unwritten:
            self._write_out()
        self._tidy()
        for _ in range(waiting):
            number, future = self._waiters.popleft()
            if number <= self._taken:
                future.get_loop().call_soon_threadsafe(_resolve, future)
            else:  # appended after this tick began: the next one
                self._waiters.appendleft((number, future))
                self._wake.set()
                break

    def _apply_confirmed(self) -> None:
        prefix = self.uid_prefix
        while self._confirmed:
            uid = self._confirmed.popleft()
            if not uid.startswith(prefix):
                entry = self._claimed.pop(uid, None)
                if entry is not None:
                    entry.left -= 1
                    if entry.left == 0:
                        _unlink(entry.path)
                continue
            number = int(uid[UID_PREFIX:], 16)
            if self._unwritten.pop(number, None) is not None:
                continue
            if number >= self._taken:
                self._early.add(number)
                continue
            at = bisect.bisect_right(self._firsts, number) - 1
            if at >= 0:
                self._segments[at].done += 1

    def _segment(self) -> _Segment:
        if self._segments and not self._segments[-1].full:
            return self._segments[-1]
        self._serial += 1
        path = self.directory / f"{PREFIX}{self.owner}-{self._serial:06d}.journal"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        segment = _Segment(path, fd, first=next(iter(self._unwritten)))
        self._segments.append(segment)
        self._firsts.append(segment.first)
        return segment

    def _write_out(self) -> None:
        try:
            segment = self._segment()
        except OSError as exc:
            self._failed(exc)
            return
        numbers = list(self._unwritten)
        lines = [encode(self._unwritten[n]) for n in numbers]
        data = b"".join(lines)
        started = time.perf_counter()
        written = 0
        try:
            view = memoryview(data)
            while written < len(data):
                written += _write(segment.fd, view[written:])
            _fsync(segment.fd)
        except OSError as exc:
            # Keep the whole records that went in; cut the one a full disk stopped in the middle.
            whole, size = 0, 0
            for line in lines:
                if size + len(line) > written:
                    break
                size, whole = size + len(line), whole + 1
            try:
                os.ftruncate(segment.fd, segment.size + size)
                _fsync(segment.fd)
            except OSError:
                whole, size = 0, 0
                try:
                    os.ftruncate(segment.fd, segment.size)
                except OSError:
                    pass
            self._wrote(segment, numbers[:whole], size)
            segment.full = segment.full or segment.records > 0  # a new file next time: maybe elsewhere freed
            self._failed(exc)
            return
        if self._on_fsync is not None:
            self._on_fsync(time.perf_counter() - started)
        self._wrote(segment, numbers, len(data))
        if self.failing:
            log.warning("the usage spool is written again")
            self.failing = False

    def _wrote(self, segment: _Segment, numbers: list[int], size: int) -> None:
        if not numbers:
            return
        if segment.records == 0:
            segment.first = numbers[0]
            self._firsts[-1] = numbers[0]
        for number in numbers:
            del self._unwritten[number]
        segment.records += len(numbers)
        segment.size += size
        self.written += len(numbers)
        if segment.size >= SEGMENT_BYTES:
            segment.full = True

    def _failed(self, exc: OSError) -> None:
        self.failing = True
        if self._on_error is not None:
            self._on_error()
        now = time.monotonic()
        if now - self._logged_at >= ERROR_LOG_EVERY:
            self._logged_at = now
            full = " (the volume is full)" if exc.errno == errno.ENOSPC else ""
            log.error("writing the usage spool in %s failed%s: %s; %d records wait in memory and are "
                      "tried again every %.1f s", self.directory, full, exc, len(self._unwritten), self.interval)

    def _tidy(self) -> None:
        """Empty or delete the segments whose every record is in the database."""
        keep: list[_Segment] = []
        for segment in self._segments:
            if segment.records and segment.done >= segment.records:
                if segment.full or segment is not self._segments[-1]:
                    os.close(segment.fd)
                    _unlink(segment.path)
                    continue
                try:  # the one being written: emptied, and used on
                    os.ftruncate(segment.fd, 0)
                    segment.records = segment.done = segment.size = 0
                except OSError:
                    segment.full = True
            keep.append(segment)
        if len(keep) != len(self._segments):
            self._segments = keep
            self._firsts = [s.first for s in keep]


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("usage spool file %s cannot be removed: %s", path.name, exc)
