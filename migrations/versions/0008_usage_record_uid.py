"""usage record uid: an idempotency key per ledger row

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 10:00:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None

INDEX = 'ux_usage_record_uid'


def upgrade() -> None:
    # A nullable column: existing rows keep NULL, which a unique index allows any number of times
    # (PostgreSQL and SQLite alike). The previous release inserts without it and keeps running.
    if op.get_bind().dialect.name != 'postgresql':
        with op.batch_alter_table('usage_records', schema=None) as batch_op:
            batch_op.add_column(sa.Column('record_uid', sa.String(length=32), nullable=True))
            batch_op.create_index(INDEX, ['record_uid'], unique=True)
        return
    # PostgreSQL: the usage table can be large, and a plain CREATE INDEX blocks its writes (every
    # request's usage record) until the index is built. CONCURRENTLY does not, but runs outside a
    # transaction, so the column is committed first; and a build that fails (a timeout, a cancel)
    # leaves an INVALID index behind and the revision unstamped. A re-run therefore finds the column
    # there, drops an invalid index and builds it again, and keeps a valid one.
    op.execute('ALTER TABLE usage_records ADD COLUMN IF NOT EXISTS record_uid VARCHAR(32)')
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
        # The build takes as long as the table is large: the 60 s statement timeout of env.py is
        # for statements that hold locks writers wait on, which this one does not.
        timeout = bind.execute(sa.text('SHOW statement_timeout')).scalar()
        op.execute('SET statement_timeout = 0')
        try:
            _build()
        finally:
            bind.execute(sa.text("SELECT set_config('statement_timeout', :value, false)"), {'value': timeout})


def _build() -> None:
    op.create_index(INDEX, 'usage_records', ['record_uid'], unique=True, postgresql_concurrently=True)


def downgrade() -> None:
    if op.get_bind().dialect.name == 'postgresql':
        with op.get_context().autocommit_block():
            op.execute(f'DROP INDEX CONCURRENTLY IF EXISTS {INDEX}')
        op.execute('ALTER TABLE usage_records DROP COLUMN IF EXISTS record_uid')
        return
    with op.batch_alter_table('usage_records', schema=None) as batch_op:
        batch_op.drop_index(INDEX)
        batch_op.drop_column('record_uid')
