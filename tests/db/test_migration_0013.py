"""0013: the usage table's index on request_id (the web UI finds a request by its id), built
without blocking usage writes on PostgreSQL, and taken off again."""

from __future__ import annotations

from typing import Any

from alembic import command
from sqlalchemy import Connection, Engine, event, text

from app.db import migrate
from tests.db.test_migrations import engine_of, fresh_url, postgresql_only  # noqa: F401 - fresh_url: a fixture

INDEX = "ix_usage_request_id"


def index_state(engine: Engine) -> Any:
    """1 or True: there and usable; False: there, INVALID (PostgreSQL); None: not there."""
    with engine.connect() as connection:
        if connection.dialect.name != "postgresql":
            return connection.execute(text("SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = :name"),
                                      {"name": INDEX}).scalar()
        return connection.execute(text("SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                                       "WHERE c.relname = :name"), {"name": INDEX}).scalar()


def test_0013_indexes_the_request_id_and_comes_off_again(fresh_url: str) -> None:  # noqa: F811
    config = migrate.alembic_config(fresh_url)
    command.upgrade(config, "0012")
    engine = engine_of(fresh_url)
    try:
        with engine.begin() as connection:  # a row of the previous release
            connection.execute(text(
                "INSERT INTO usage_records (at, request_id, operation, model, status, input_tokens, output_tokens, "
                "latency_ms) VALUES (CURRENT_TIMESTAMP, 'order-42', 'decision', 'nimble', 200, 1, 1, 0.1)"))
        assert index_state(engine) is None
        command.upgrade(config, "0013")
        assert index_state(engine) in (True, 1)
        with engine.connect() as connection:
            found = connection.execute(text("SELECT model FROM usage_records WHERE request_id = 'order-42'"))
            assert found.scalar() == "nimble"
        command.downgrade(config, "0012")
        assert index_state(engine) is None
        command.upgrade(config, "0013")  # and up again
        assert index_state(engine) in (True, 1)
    finally:
        engine.dispose()


@postgresql_only
def test_0013_builds_its_index_concurrently_and_repairs_an_invalid_one(fresh_url: str) -> None:  # noqa: F811
    """A plain CREATE INDEX holds a SHARE lock, which stops every usage write until it is built; a
    concurrent build that failed leaves an INVALID index, which a re-run drops and builds again."""
    config = migrate.alembic_config(fresh_url)
    command.upgrade(config, "0012")
    engine = engine_of(fresh_url)
    seen: list[tuple[str, bool]] = []

    def note(connection: Connection, _cursor: Any, statement: str, *_: Any) -> None:
        if INDEX in statement and statement.lstrip().upper().startswith("CREATE"):
            autocommit = connection.get_execution_options().get("isolation_level") == "AUTOCOMMIT"
            seen.append((" ".join(statement.split()), autocommit))

    try:
        with engine.begin() as connection:  # as a failed build leaves it
            connection.execute(text(f"CREATE INDEX {INDEX} ON usage_records (request_id)"))
            connection.execute(text("UPDATE pg_index SET indisvalid = false WHERE indexrelid = "
                                    f"'{INDEX}'::regclass"))
        assert index_state(engine) is False
        event.listen(Engine, "before_cursor_execute", note)
        try:
            command.upgrade(config, "0013")
        finally:
            event.remove(Engine, "before_cursor_execute", note)
        assert seen == [(f"CREATE INDEX CONCURRENTLY {INDEX} ON usage_records (request_id)", True)]
        assert index_state(engine) is True
        assert migrate.current_revision(engine) == "0013"
    finally:
        engine.dispose()
