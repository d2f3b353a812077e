"""Alembic environment. Migrations must work while the previous release still runs."""

from __future__ import annotations

from alembic import context
from sqlalchemy import engine_from_config, pool

from app.db.models import Base

config = context.config
target_metadata = Base.metadata


def run_migrations_offline() -> None:
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata,
                      literal_binds=True, render_as_batch=True, include_object=include_object)
    with context.begin_transaction():
        context.run_migrations()


def include_object(obj: object, name: str | None, type_: str, reflected: bool, compare_to: object) -> bool:
    """What ``alembic check`` compares: not the usage ledger's day partitions, nor the previous
    release's ``usage_records`` (0018), which PostgreSQL holds beside the models' tables."""
    if type_ == "table" and reflected and compare_to is None and name is not None:
        return not (name == "usage_records" or name.startswith("usage_ledger_"))
    return True


def run_migrations_online() -> None:
    given = config.attributes.get("connection")
    if given is not None:  # app.db.migrate holds it, with the migration lock taken
        _run(given)
        given.commit()
        return
    connectable = engine_from_config(
        config.get_section(config.config_ini_section, {}), prefix="sqlalchemy.",
        poolclass=pool.NullPool,
    )
    with connectable.connect() as connection:
        _run(connection)


def _run(connection: object) -> None:
    if connection.dialect.name == "postgresql":  # type: ignore[attr-defined]
        connection.exec_driver_sql("SET lock_timeout = '10s'")  # type: ignore[attr-defined]
        connection.exec_driver_sql("SET statement_timeout = '60s'")  # type: ignore[attr-defined]
        connection.commit()  # type: ignore[attr-defined]  # settings stay; alembic owns the transaction
    context.configure(connection=connection, target_metadata=target_metadata, include_object=include_object,
                      render_as_batch=connection.dialect.name == "sqlite")  # type: ignore[attr-defined]
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
