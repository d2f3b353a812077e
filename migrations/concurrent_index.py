"""Building an index on a large PostgreSQL table without blocking its writers (0008, 0013).

A plain CREATE INDEX blocks every usage write until it is built. CONCURRENTLY does not, but runs
outside a transaction, and a build that fails (a timeout, a cancel) leaves an INVALID index
behind and the revision unstamped: a re-run therefore drops an invalid index and builds it again,
and keeps a valid one.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


def create(index: str, table: str, columns: Sequence[str], *, unique: bool = False) -> None:
    """``CREATE [UNIQUE] INDEX CONCURRENTLY`` once, on PostgreSQL, in an autocommit block."""

    def build() -> None:
        op.create_index(index, table, list(columns), unique=unique, postgresql_concurrently=True)

    with op.get_context().autocommit_block():
        if op.get_context().as_sql:  # `alembic upgrade --sql`: nothing to ask, so drop and build
            op.execute(f'DROP INDEX CONCURRENTLY IF EXISTS {index}')
            op.execute('SET statement_timeout = 0')
            build()
            op.execute('RESET statement_timeout')
            return
        bind = op.get_bind()
        valid = bind.execute(sa.text(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relname = :name AND c.relnamespace = to_regnamespace(current_schema())::oid"),
            {'name': index}).scalar()
        if valid:
            return
        if valid is not None:
            op.execute(f'DROP INDEX CONCURRENTLY IF EXISTS {index}')
        # The build takes as long as the table is large: env.py's 60 s statement timeout is for
        # statements that hold locks writers wait on, which this one does not.
        timeout = bind.execute(sa.text('SHOW statement_timeout')).scalar()
        op.execute('SET statement_timeout = 0')
        try:
            build()
        finally:
            bind.execute(sa.text("SELECT set_config('statement_timeout', :value, false)"), {'value': timeout})


def drop(index: str) -> None:
    """``DROP INDEX CONCURRENTLY IF EXISTS``, on PostgreSQL, in an autocommit block."""
    with op.get_context().autocommit_block():
        op.execute(f'DROP INDEX CONCURRENTLY IF EXISTS {index}')
