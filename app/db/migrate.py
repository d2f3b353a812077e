"""Alembic, driven from code: apply migrations, and tell whether the database is current."""

from __future__ import annotations

import functools
import logging
import time
from pathlib import Path
from typing import Any

import sqlalchemy
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import create_engine
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool

from app.settings import sqlalchemy_url

log = logging.getLogger("arbiter.migrate")

MIGRATIONS = Path(__file__).resolve().parent.parent.parent / "migrations"


class NotMigrated(RuntimeError):
    """The database is behind the code's migrations."""


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", sqlalchemy_url(database_url).replace("%", "%%"))
    return config


MIGRATION_LOCK = 7_271_001  # pg_advisory_lock key: one migrating replica at a time


def _known(scripts: ScriptDirectory, revision: str) -> bool:
    try:
        return scripts.get_revision(revision) is not None
    except CommandError:  # a revision it has never heard of
        return False


def upgrade(database_url: str) -> None:
    """Apply migrations. On PostgreSQL under an advisory lock, so replicas started together with
    ARBITER_AUTO_MIGRATE migrate one after the other (the later ones find nothing to do)."""
    config = alembic_config(database_url)
    url = sqlalchemy_url(database_url)
    if not url.startswith("postgresql"):
        command.upgrade(config, "head")
        return
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            _take_migration_lock(connection)
            try:
                config.attributes["connection"] = connection
                command.upgrade(config, "head")
            finally:
                connection.exec_driver_sql(f"SELECT pg_advisory_unlock({MIGRATION_LOCK})")
                connection.commit()
    finally:
        engine.dispose()


def _take_migration_lock(connection: Any) -> None:
    """The session's advisory lock, asked for again every quarter second rather than waited on: a
    waiting ``pg_advisory_lock`` holds a snapshot, and a migration building an index CONCURRENTLY
    (0008) waits for every older snapshot to end, so it and the replicas waiting for it would
    deadlock. Between tries nothing is open (each try is committed); the lock outlives commits."""
    waited = False
    while True:
        taken = connection.exec_driver_sql(f"SELECT pg_try_advisory_lock({MIGRATION_LOCK})").scalar()
        connection.commit()
        if taken:
            return
        if not waited:
            log.info("another process is migrating the database; waiting for it")
            waited = True
        time.sleep(0.25)


@functools.cache
def scripts() -> ScriptDirectory:
    """The migrations this code ships, read once per process: they change only with the code.
    (Reading them is ~5 ms; /readyz asks on every probe.)"""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return ScriptDirectory.from_config(config)


@functools.cache
def head_revision() -> str | None:
    return scripts().get_current_head()


def current_revision(engine: Engine) -> str | None:
    """The database's revision, read straight from Alembic's table: /readyz asks every few
    seconds, and Alembic's MigrationContext writes two INFO lines each time it is made."""
    with engine.connect() as connection:
        if not sqlalchemy.inspect(connection).has_table("alembic_version"):
            return None
        revisions = connection.execute(sqlalchemy.text("SELECT version_num FROM alembic_version")).scalars().all()
    if len(revisions) > 1:
        raise RuntimeError(f"the database has several Alembic heads: {', '.join(sorted(revisions))}")
    return revisions[0] if revisions else None


def check_current(engine: Engine) -> None:
    """Raise NotMigrated (naming the command that fixes it) when the database is behind the code.

    A revision this code does not know is a newer release's: migrations are written to work
    while the previous release still runs, so during a rolling upgrade that is fine."""
    current, head = current_revision(engine), head_revision()
    if current == head:
        return
    known = current is not None and _known(scripts(), current)
    if current is not None and not known:
        return
    if current != head:
        raise NotMigrated(
            f"the database is not migrated (at {current or 'no revision'}, code needs {head}); "
            "run `arbiter migrate` (or set ARBITER_AUTO_MIGRATE=true)"
        )
