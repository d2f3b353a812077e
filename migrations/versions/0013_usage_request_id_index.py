"""usage request id index: find a request by the X-Request-Id its caller got

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02 04:00:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None

INDEX = 'ix_usage_request_id'


def upgrade() -> None:
    # The web UI's request page (and its search box) finds a request by its id: without an index
    # that reads the whole usage table. An index changes nothing the previous release does (its
    # inserts only maintain it), so it keeps running beside this one.
    if op.get_bind().dialect.name != 'postgresql':
        with op.batch_alter_table('usage_records', schema=None) as batch_op:
            batch_op.create_index(INDEX, ['request_id'], unique=False)
        return
    # PostgreSQL: as 0008, the table can be large and a plain CREATE INDEX blocks every usage write
    # until it is built. CONCURRENTLY does not, but runs outside a transaction, and a build that fails
    # (a timeout, a cancel) leaves an INVALID index behind and the revision unstamped: a re-run drops
    # an invalid index and builds it again, and keeps a valid one.
    with op.get_context().autocommit_block():
        if op.get_context().as_sql:  # `alembic upgrade --sql`: nothing to ask, so drop and build
            op.execute(f'DROP INDEX CONCURRENTLY IF EXISTS {INDEX}')
            op.execute('SET statement_timeout = 0')
            _build()
            op.execute('RESET statement_timeout')
            return
        bind = op.get_bind()
        valid = bind.execute(sa.text(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relname = :name AND c.relnamespace = to_regnamespace(current_schema())::oid"),
            {'name': INDEX}).scalar()
        if valid:
            return
        if valid is not None:
            op.execute(f'DROP INDEX CONCURRENTLY IF EXISTS {INDEX}')
        # The build takes as long as the table is large: env.py's 60 s statement timeout is for
        # statements that hold locks writers wait on, which this one does not.
        timeout = bind.execute(sa.text('SHOW statement_timeout')).scalar()
        op.execute('SET statement_timeout = 0')
        try:
            _build()
        finally:
            bind.execute(sa.text("SELECT set_config('statement_timeout', :value, false)"), {'value': timeout})


def _build() -> None:
    op.create_index(INDEX, 'usage_records', ['request_id'], unique=False, postgresql_concurrently=True)


def downgrade() -> None:
    if op.get_bind().dialect.name == 'postgresql':
        with op.get_context().autocommit_block():
            op.execute(f'DROP INDEX CONCURRENTLY IF EXISTS {INDEX}')
        return
    with op.batch_alter_table('usage_records', schema=None) as batch_op:
        batch_op.drop_index(INDEX)
