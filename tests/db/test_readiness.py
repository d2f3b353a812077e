"""Database.unready_reason, what /readyz answers with: the kind of failure for an unauthenticated
caller, the detail for the log only. (tests/api/public/test_health.py asks /readyz itself.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from app.db.session import Database


def test_a_database_that_cannot_be_opened_is_unavailable(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    database = Database(f"sqlite:///{tmp_path / 'no-such-directory' / 'arbiter.db'}")
    try:
        reason = database.unready_reason()
    finally:
        database.dispose()
    assert reason == "the database is unavailable (OperationalError)"
    [logged] = [r.getMessage() for r in caplog.records if r.name == "arbiter.db"]
    assert logged.startswith("not ready: (sqlite3.OperationalError) unable to open database file")


def test_a_database_without_the_codes_migrations_is_behind(tmp_path: Path) -> None:
    database = Database(f"sqlite:///{tmp_path / 'empty.db'}")
    try:
        assert database.unready_reason() == "the database is behind the code's migrations; run arbiter migrate"
    finally:
        database.dispose()


def test_a_migrated_database_is_ready(db: Database) -> None:
    assert db.unready_reason() is None
