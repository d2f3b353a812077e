"""Report queries (every usage read) on a pool of their own: their own engine with a small
connection pool, their own worker threads, a statement timeout on each, and a per-key rate.

A report can be slow; it can never take a key lookup's thread or connection. Key lookups and the
ledger run on ``Database``'s engine through asyncio's default executor; reports run here, at most
``pool_size`` at a time, and a caller asking for more than ``MAX_WAITING`` per connection is told
to come back rather than queued for minutes."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy import text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from app.db.session import make_engine
from app.errors import BackendFailed, RateLimited
from app.settings import sqlalchemy_url

T = TypeVar("T")
QUERY_CANCELED = "57014"  # PostgreSQL's SQLSTATE for a statement stopped by statement_timeout
MAX_WAITING = 4  # reports waiting per connection of the pool before more are refused (503)
SQLITE_STEPS = 10_000  # SQLite virtual machine steps between two looks at the clock


class Reports:
    def __init__(self, url: str, *, pool_size: int = 2, timeout: float = 10.0, per_minute: int = 30) -> None:
        self.timeout = timeout
        self.engine = make_engine(sqlalchemy_url(url), pool_size=pool_size, max_overflow=0)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._executor = ThreadPoolExecutor(max_workers=pool_size, thread_name_prefix="arbiter-report")
        self._capacity = pool_size * (1 + MAX_WAITING)
        self._running = 0
        self.limiter = ReadLimiter(per_minute)

    async def run(self, work: Callable[[Session], T], *, who: int | str | None = None, what: str = "") -> T:
        """``work(session)`` on the report pool, in one read transaction, each statement stopped after
        ``timeout`` seconds (a 504 that says to narrow ``what``). ``who`` (a key's id) is held to
        the per-key rate (429 with Retry-After)."""
        if who is not None:
            wait = self.limiter.take(str(who))
            if wait is not None:
                raise RateLimited(f"Too many usage reads with this key: at most {self.limiter.per_minute} a minute; "
                                  f"try again in {wait} s.", headers={"Retry-After": str(wait)})
        if self._running >= self._capacity:
            raise BackendFailed(503, "Too many usage reports are running; try again in a few seconds.",
                                retry_after=5)
        self._running += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, self._run, work, what)
        finally:
            self._running -= 1

    def _run(self, work: Callable[[Session], T], what: str) -> T:
        with self._sessions.begin() as session, bounded(session, self.timeout, what):
            return work(session)

    def dispose(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self.engine.dispose()


@contextmanager
def bounded(session: Session, seconds: float, what: str = "") -> Iterator[None]:
    """The rest of ``session``'s transaction stopped after ``seconds`` a statement: PostgreSQL's
    ``SET LOCAL statement_timeout``; on SQLite a progress handler that interrupts the query once
    the time is past. A stopped query is a 504 saying what to narrow."""
    connection = session.connection()
    handler: Any = None
    if connection.dialect.name == "postgresql":
        connection.execute(text(f"SET LOCAL statement_timeout = {max(1, int(seconds * 1000))}"))
    else:
        raw: Any = connection.connection.driver_connection
        deadline = time.monotonic() + seconds
        handler = raw

        def past() -> int:
            return 1 if time.monotonic() > deadline else 0
        raw.set_progress_handler(past, SQLITE_STEPS)
    try:
        yield
    except OperationalError as exc:
        if not stopped(exc):
            raise
        where = f" ({what})" if what else ""
        raise BackendFailed(504, f"The usage report{where} ran longer than {seconds:g} s and was stopped; "
                                 "choose a shorter period, one project or one key.") from exc
    finally:
        if handler is not None:
            handler.set_progress_handler(None, SQLITE_STEPS)


def stopped(exc: OperationalError) -> bool:
    """A statement stopped by its timeout (not a database that is away)."""
    if getattr(exc.orig, "sqlstate", None) == QUERY_CANCELED:
        return True
    return isinstance(exc.orig, sqlite3.OperationalError) and "interrupted" in str(exc.orig)


class ReadLimiter:
    """At most ``per_minute`` reads per key in any minute-long window (this replica's count; 0: no
    limit). ``take`` answers None, or the seconds to wait."""

    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self._windows: dict[str, tuple[float, int]] = {}
        self._lock = threading.Lock()

    def take(self, who: str, now: float | None = None) -> int | None:
        if self.per_minute <= 0:
            return None
        now = time.monotonic() if now is None else now
        with self._lock:
            if len(self._windows) > 10_000:  # keys gone quiet: forget them
                self._windows = {k: v for k, v in self._windows.items() if now - v[0] < 60}
            start, used = self._windows.get(who, (now, 0))
            if now - start >= 60:
                start, used = now, 0
            if used >= self.per_minute:
                return max(1, int(60 - (now - start)) + 1)
            self._windows[who] = (start, used + 1)
            return None
