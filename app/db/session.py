"""Engines and sessions: one pooled engine per process, sessions per unit of work."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DisconnectionError, InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session, sessionmaker

from app.db import migrate, rollups
from app.settings import sqlalchemy_url

T = TypeVar("T")
log = logging.getLogger("arbiter.db")
# What a database that cannot be reached raises (refused, cut, timed out), as against one that
# answers with an error of its own.
UNREACHABLE = (OperationalError, InterfaceError, DisconnectionError, PoolTimeout, TimeoutError, OSError)


class Database:
    """Owns the engine and hands out sessions. Built once in the app's lifespan."""

    def __init__(self, url: str, *, echo: bool = False) -> None:
        self.url = sqlalchemy_url(url)
        self.engine = make_engine(self.url, echo=echo)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        rollups.track(self._sessions)  # usage records added through the ORM are rolled up as they flush

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session in a transaction: committed on success, rolled back on error."""
        with self._sessions.begin() as session:
            yield session

    async def in_session(self, work: Callable[[Session], T]) -> T:
        """Run ``work(session)`` in a worker thread, in one transaction."""
        def run() -> T:
            with self.session() as session:
                return work(session)
        return await asyncio.to_thread(run)

    def unready_reason(self) -> str | None:
        """Why the database cannot serve this code (``/readyz``'s 503), or None when it answers and
        is not behind the code's migrations. Blocking: run it in a worker thread."""
        return self.state()[1]

    def state(self) -> tuple[str, str | None]:
        """("ok", None), ("unreachable", why) or ("behind", why): whether the database answers and is
        not behind the code's migrations. Blocking: run it in a worker thread.

        The reason goes to unauthenticated callers, so it names the kind of failure, never hosts,
        users or SQL; those go to the log."""
        try:
            with self.engine.connect() as connection:
                connection.execute(text("SELECT 1"))
            migrate.check_current(self.engine)
        except migrate.NotMigrated as exc:
            log.warning("not ready: %s", exc)
            return "behind", "the database is behind the code's migrations; run arbiter migrate"
        except (SQLAlchemyError, OSError) as exc:
            log.warning("not ready: %s", exc)
            return "unreachable", f"the database is unavailable ({type(exc).__name__})"
        return "ok", None

    def dispose(self) -> None:
        self.engine.dispose()


def make_engine(url: str, *, echo: bool = False, pool_size: int = 10, max_overflow: int = 20) -> Engine:
    kwargs: dict[str, Any] = {"echo": echo, "future": True}
    if url.startswith("sqlite"):
        kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
    else:
        kwargs.update(pool_size=pool_size, max_overflow=max_overflow, pool_pre_ping=True, pool_recycle=1800)
        kwargs["connect_args"] = {"connect_timeout": 5}
    engine = create_engine(url, **kwargs)
    if url.startswith("sqlite"):
        event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()
