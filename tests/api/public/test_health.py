"""GET /healthz and GET /readyz (SPEC §2): unauthenticated, and cheap enough to probe often."""

from __future__ import annotations

from typing import Any

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import text

from app.db import migrate
from app.db.session import Database
from tests.support import Gateway


def test_probes_answer_without_a_key(gateway_factory: Any) -> None:
    with gateway_factory().client() as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        assert client.get("/readyz").json() == {"status": "ready"}


def test_readyz_does_not_read_the_migrations_again(gateway_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The code's migrations are read once per process (~5 ms each time), not on every probe."""
    gateway: Gateway = gateway_factory()
    reads: list[Any] = []
    original = ScriptDirectory.from_config.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(ScriptDirectory, "from_config",
                        classmethod(lambda cls, *args, **kw: reads.append(args) or original(cls, *args, **kw)))
    with gateway.client() as client:
        for _ in range(5):
            assert client.get("/readyz").json() == {"status": "ready"}
    assert reads == []


def test_readyz_still_sees_a_database_behind_the_code(db: Database, gateway_factory: Any) -> None:
    with gateway_factory().client() as client:
        assert client.get("/readyz").status_code == 200
        head = migrate.head_revision()
        previous = migrate.scripts().get_revision(head).down_revision
        with db.engine.begin() as connection:
            connection.execute(text("UPDATE alembic_version SET version_num = :v"), {"v": previous})
        try:
            behind = client.get("/readyz")
        finally:
            with db.engine.begin() as connection:
                connection.execute(text("UPDATE alembic_version SET version_num = :v"), {"v": head})
    assert behind.status_code == 503
    assert behind.json() == {"status": "not ready",
                             "reason": "the database is behind the code's migrations; run arbiter migrate"}
