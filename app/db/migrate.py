"""Alembic, driven from code: apply migrations, and tell whether the database is current."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Engine

from app.settings import sqlalchemy_url

MIGRATIONS = Path(__file__).resolve().parent.parent.parent / "migrations"


class NotMigrated(RuntimeError):
    """The database is behind the code's migrations."""


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", sqlalchemy_url(database_url).replace("%", "%%"))
    return config


def upgrade(database_url: str) -> None:
    command.upgrade(alembic_config(database_url), "head")


def head_revision(database_url: str) -> str | None:
    return ScriptDirectory.from_config(alembic_config(database_url)).get_current_head()


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def check_current(engine: Engine, database_url: str) -> None:
    """Raise NotMigrated (naming the command that fixes it) unless at head."""
    current, head = current_revision(engine), head_revision(database_url)
    if current != head:
        raise NotMigrated(
            f"the database is not migrated (at {current or 'no revision'}, code needs {head}); "
            "run `arbiter migrate` (or set ARBITER_AUTO_MIGRATE=true)"
        )
