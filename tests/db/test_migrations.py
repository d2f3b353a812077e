"""Migrations on a database of their own, on SQLite or PostgreSQL (ARBITER_TEST_DATABASE_URL):
0008's unique index on the usage table, which can be large and takes writes on every request."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from sqlalchemy import Connection, Engine, create_engine, event, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, IntegrityError

from app.db import migrate
from app.settings import sqlalchemy_url

BASE = os.environ.get("ARBITER_TEST_DATABASE_URL", "")
ON_POSTGRESQL = BASE.startswith(("postgresql", "postgres"))
postgresql_only = pytest.mark.skipif(not ON_POSTGRESQL, reason="PostgreSQL's CONCURRENTLY (ARBITER_TEST_DATABASE_URL)")


@pytest.fixture
def fresh_url(tmp_path: Path) -> Iterator[str]:
    """An empty database, not migrated."""
    if not ON_POSTGRESQL:
        yield f"sqlite:///{tmp_path / 'fresh.db'}"
        return
    name = f"arbiter_migrations_{uuid.uuid4().hex[:12]}"
    server = make_url(sqlalchemy_url(BASE))
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield server.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def engine_of(url: str) -> Engine:
    return create_engine(sqlalchemy_url(url))


def add_usage(connection: Connection, uid: str | None) -> None:
    connection.execute(text(
        "INSERT INTO usage_records (at, request_id, operation, model, status, input_tokens, output_tokens, "
        "latency_ms, record_uid) VALUES (CURRENT_TIMESTAMP, 'r', 'decision', 'nimble', 200, 1, 1, 0.1, :uid)"),
        {"uid": uid})


def index_state(engine: Engine) -> Any:
    with engine.connect() as connection:
        if connection.dialect.name != "postgresql":
            return connection.execute(text("SELECT 1 FROM sqlite_master WHERE type = 'index' "
                                           "AND name = 'ux_usage_record_uid'")).scalar()
        return connection.execute(text(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relname = 'ux_usage_record_uid'")).scalar()


def test_0008_gives_the_usage_table_a_unique_record_uid_and_comes_off_again(fresh_url: str) -> None:
    config = migrate.alembic_config(fresh_url)
    command.upgrade(config, "0007")
    engine = engine_of(fresh_url)
    try:
        with engine.begin() as connection:  # rows of the previous release, inserted without the column
            connection.execute(text(
                "INSERT INTO usage_records (at, request_id, operation, model, status, input_tokens, "
                "output_tokens, latency_ms) VALUES (CURRENT_TIMESTAMP, 'r', 'decision', 'nimble', 200, 1, 1, 0.1)"))
        command.upgrade(config, "0017")  # the last on usage_records (0018 makes usage_ledger)
        assert index_state(engine) in (True, 1)
        with engine.begin() as connection:
            add_usage(connection, None)
            add_usage(connection, None)  # NULLs (old rows, the old release's inserts) never clash
            add_usage(connection, "a" * 32)
        with pytest.raises(IntegrityError), engine.begin() as connection:
            add_usage(connection, "a" * 32)
        command.downgrade(config, "0007")
        assert index_state(engine) is None
        command.upgrade(config, "0017")  # and up again
        assert index_state(engine) in (True, 1)
    finally:
        engine.dispose()


@postgresql_only
def test_0008_builds_its_index_concurrently_outside_a_transaction(fresh_url: str) -> None:
    """A plain CREATE INDEX holds a SHARE lock, which stops every usage write until it is built."""
    command.upgrade(migrate.alembic_config(fresh_url), "0007")
    seen: list[tuple[str, bool]] = []

    def note(connection: Connection, _cursor: Any, statement: str, *_: Any) -> None:
        if "ux_usage_record_uid" in statement and statement.lstrip().upper().startswith("CREATE"):
            autocommit = connection.get_execution_options().get("isolation_level") == "AUTOCOMMIT"
            seen.append((" ".join(statement.split()), autocommit))

    event.listen(Engine, "before_cursor_execute", note)
    try:
        migrate.upgrade(fresh_url)
    finally:
        event.remove(Engine, "before_cursor_execute", note)
    assert seen == [("CREATE UNIQUE INDEX CONCURRENTLY ux_usage_record_uid ON usage_records (record_uid)", True)]


@postgresql_only
def test_0008_run_again_after_a_failed_concurrent_build_repairs_the_invalid_index(fresh_url: str) -> None:
    """A concurrent build that fails (here: duplicates; in life a timeout or a cancel) leaves the
    column committed, an INVALID index, and the revision at 0007. Running the migration again
    must finish the job, not stop at "column already exists"."""
    command.upgrade(migrate.alembic_config(fresh_url), "0007")
    engine = engine_of(fresh_url)
    try:
        with engine.begin() as connection:
            connection.execute(text("ALTER TABLE usage_records ADD COLUMN record_uid VARCHAR(32)"))
            add_usage(connection, "b" * 32)
            add_usage(connection, "b" * 32)
        with pytest.raises(IntegrityError), engine.connect() as connection:
            connection.execution_options(isolation_level="AUTOCOMMIT").execute(text(
                "CREATE UNIQUE INDEX CONCURRENTLY ux_usage_record_uid ON usage_records (record_uid)"))
        assert index_state(engine) is False  # INVALID, and never used for uniqueness
        with engine.begin() as connection:
            connection.execute(text("DELETE FROM usage_records"))
        migrate.upgrade(fresh_url)
        assert index_state(engine) is True
        assert migrate.current_revision(engine) == migrate.head_revision()
        with pytest.raises(IntegrityError), engine.begin() as connection:
            add_usage(connection, "c" * 32)
            add_usage(connection, "c" * 32)
    finally:
        engine.dispose()


def columns(engine: Engine, table: str) -> set[str]:
    return {column["name"] for column in inspect(engine).get_columns(table)}


def add_audit(connection: Connection) -> None:
    connection.execute(text("INSERT INTO audit_log (at, actor, action, target, details) "
                            "VALUES (CURRENT_TIMESTAMP, 'cli', 'project.create', 'project:p', '{}')"))


def test_0010_adds_ui_sessions_and_the_callers_request_id_and_comes_off_again(fresh_url: str) -> None:
    config = migrate.alembic_config(fresh_url)
    command.upgrade(config, "0009")
    engine = engine_of(fresh_url)
    try:
        with engine.begin() as connection:
            add_audit(connection)  # a row of the previous release, inserted without the new column
        command.upgrade(config, "0010")
        assert "ui_sessions" in inspect(engine).get_table_names()
        session_columns = {"digest", "key_id", "created_at", "last_seen_at", "expires_at", "ended_at"}
        assert session_columns <= columns(engine, "ui_sessions")
        assert "client_request_id" in columns(engine, "audit_log")
        with engine.begin() as connection:
            add_audit(connection)  # the previous release still inserts
            assert connection.execute(text("SELECT count(*) FROM audit_log "
                                           "WHERE client_request_id IS NULL")).scalar() == 2
        command.downgrade(config, "0009")
        assert "ui_sessions" not in inspect(engine).get_table_names()
        assert "client_request_id" not in columns(engine, "audit_log")
        command.upgrade(config, "0010")  # and up again
        assert "ui_sessions" in inspect(engine).get_table_names()
    finally:
        engine.dispose()


@postgresql_only
def test_0010_makes_the_audit_log_refuse_update_and_delete_on_postgresql(fresh_url: str) -> None:
    """Against Arbiter's own role and its mistakes: an UPDATE or DELETE fails, an INSERT works,
    and the downgrade lifts the guard again."""
    config = migrate.alembic_config(fresh_url)
    command.upgrade(config, "0010")
    engine = engine_of(fresh_url)
    try:
        with engine.begin() as connection:
            add_audit(connection)
        for statement in ("UPDATE audit_log SET actor = 'someone else'", "DELETE FROM audit_log",
                          "DELETE FROM audit_log WHERE id = 1"):
            with pytest.raises(DBAPIError, match="append-only"), engine.begin() as connection:
                connection.execute(text(statement))
        with engine.begin() as connection:
            assert connection.execute(text("SELECT actor FROM audit_log")).scalars().all() == ["cli"]
        command.downgrade(config, "0009")
        with engine.begin() as connection:
            connection.execute(text("DELETE FROM audit_log"))  # no guard without 0010
    finally:
        engine.dispose()


def test_0011_adds_aliases_and_the_usage_alias_and_comes_off_again(fresh_url: str) -> None:
    config = migrate.alembic_config(fresh_url)
    command.upgrade(config, "0010")
    engine = engine_of(fresh_url)
    try:
        with engine.begin() as connection:
            add_usage(connection, "before")  # a row of the previous release
        command.upgrade(config, "0011")
        assert {"id", "name", "target", "created_at"} <= columns(engine, "model_aliases")
        assert "alias" in columns(engine, "usage_records")
        with engine.begin() as connection:
            add_usage(connection, "after")  # the previous release still inserts, without the alias
            assert connection.execute(text("SELECT count(*) FROM usage_records WHERE alias IS NULL")).scalar() == 2
            connection.execute(text("INSERT INTO model_aliases (name, target, created_at) "
                                    "VALUES ('jev-latest', 'nimble', CURRENT_TIMESTAMP)"))
            with pytest.raises(IntegrityError), connection.begin_nested():  # one alias per name
                connection.execute(text("INSERT INTO model_aliases (name, target, created_at) "
                                        "VALUES ('jev-latest', 'clef', CURRENT_TIMESTAMP)"))
        command.downgrade(config, "0010")
        assert "model_aliases" not in inspect(engine).get_table_names()
        assert "alias" not in columns(engine, "usage_records")
        command.upgrade(config, "0011")  # and up again
    finally:
        engine.dispose()


def test_0012_adds_the_models_embedding_temperature_and_takes_it_off_again(fresh_url: str) -> None:
    config = migrate.alembic_config(fresh_url)
    command.upgrade(config, "0011")
    engine = engine_of(fresh_url)
    try:
        assert "embedding_temperature" not in columns(engine, "models")
        command.upgrade(config, "0012")
        assert "embedding_temperature" in columns(engine, "models")
        command.downgrade(config, "0011")
        assert "embedding_temperature" not in columns(engine, "models")
        command.upgrade(config, "0012")  # and up again
    finally:
        engine.dispose()


def fold(connection: Connection, key: str) -> None:
    """The upsert app/audit.py fold runs: the first row of ``key``, then one more on its count."""
    connection.execute(text(
        "INSERT INTO audit_log (at, actor, action, target, details, count, fold_key) VALUES (CURRENT_TIMESTAMP, "
        "'admin-key:2:x', 'permission.denied', 'route:GET /a', '{}', 1, :key) "
        "ON CONFLICT (fold_key) DO UPDATE SET count = audit_log.count + 1"), {"key": key})


def test_0014_adds_the_count_and_fold_key_and_comes_off_again(fresh_url: str) -> None:
    config = migrate.alembic_config(fresh_url)
    command.upgrade(config, "0013")
    engine = engine_of(fresh_url)
    try:
        with engine.begin() as connection:
            add_audit(connection)  # a row of the previous release
        command.upgrade(config, "0014")
        assert {"count", "fold_key"} <= columns(engine, "audit_log")
        with engine.begin() as connection:
            add_audit(connection)  # the previous release still inserts: count 1, no fold key
            for _ in range(3):
                fold(connection, "k1")
            fold(connection, "k2")
            counts = connection.execute(text("SELECT fold_key, count FROM audit_log ORDER BY id")).all()
        assert [tuple(row) for row in counts] == [(None, 1), (None, 1), ("k1", 3), ("k2", 1)]
        command.downgrade(config, "0013")
        assert not {"count", "fold_key"} & columns(engine, "audit_log")
        command.upgrade(config, "0014")  # and up again
    finally:
        engine.dispose()


@postgresql_only
def test_0014_lets_the_append_only_trigger_pass_a_growing_count_and_nothing_else(fresh_url: str) -> None:
    config = migrate.alembic_config(fresh_url)
    command.upgrade(config, "0014")
    engine = engine_of(fresh_url)
    try:
        with engine.begin() as connection:
            add_audit(connection)
            fold(connection, "k1")
            fold(connection, "k1")  # the fold's update passes
        for statement in ("UPDATE audit_log SET actor = 'someone else'",
                          "UPDATE audit_log SET count = count + 1, actor = 'someone else'",
                          "UPDATE audit_log SET count = count + 1, details = '{\"path\": \"/b\"}'",
                          "UPDATE audit_log SET count = 1 WHERE fold_key = 'k1'",  # never down
                          "UPDATE audit_log SET count = count WHERE fold_key = 'k1'",
                          "DELETE FROM audit_log", "DELETE FROM audit_log WHERE id = 1"):
            with pytest.raises(DBAPIError, match="append-only"), engine.begin() as connection:
                connection.execute(text(statement))
        with engine.begin() as connection:
            rows = connection.execute(text("SELECT actor, count FROM audit_log ORDER BY id")).all()
            assert [tuple(row) for row in rows] == [("cli", 1), ("admin-key:2:x", 2)]
        command.downgrade(config, "0013")
        with pytest.raises(DBAPIError, match="append-only"), engine.begin() as connection:
            connection.execute(text("UPDATE audit_log SET actor = 'x'"))  # 0010's guard again, whole
        with engine.begin() as connection:
            assert connection.execute(text("SELECT count(*) FROM audit_log")).scalar() == 2
    finally:
        engine.dispose()
