"""Getting a database ready for use, shared by the gateway's start-up and the command line.

It imports only what that needs: a command such as ``arbiter key create`` then starts without the
serving stack (backends, mesh, telemetry), which at one second of imports was most of its time."""

from __future__ import annotations

import logging

from sqlalchemy.exc import IntegrityError

from app.db import migrate
from app.db.session import UNREACHABLE, Database
from app.settings import Settings
from app.tenancy import service as tenancy
from app.tenancy.keys import KeyHasher

log = logging.getLogger("arbiter")


def key_hasher(settings: Settings) -> KeyHasher:
    return KeyHasher(settings.key_pepper.get_secret_value() if settings.key_pepper else None)


def unreachable_reason(exc: BaseException, url: str) -> str | None:
    """Why a server database (not a SQLite file: nothing to wait for there) cannot be reached, in one
    line without the password; None for any other error."""
    if not isinstance(exc, UNREACHABLE) or url.startswith("sqlite"):
        return None
    orig = getattr(exc, "orig", None)
    lines = str(orig if orig is not None else exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def prepare_database(settings: Settings, database: Database, hasher: KeyHasher) -> None:
    """Migrate (when configured) or refuse an unmigrated database; bootstrap the admin key."""
    if settings.auto_migrate:
        migrate.upgrade(settings.database_url)
    migrate.check_current(database.engine)
    if settings.bootstrap_admin_key is not None:
        value = settings.bootstrap_admin_key.get_secret_value()
        try:
            with database.session() as session:
                if tenancy.ensure_bootstrap_admin_key(session, hasher, value):
                    log.info("registered the admin key from ARBITER_BOOTSTRAP_ADMIN_KEY")
        except IntegrityError:
            # Another replica starting at the same moment registered the same key first.
            with database.session() as session:
                if not tenancy.key_registered(session, hasher, value):
                    raise
