"""usage record uid: an idempotency key per ledger row

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 10:00:00
"""
from alembic import op
import sqlalchemy as sa

from migrations import concurrent_index


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
    # PostgreSQL: the usage table can be large; the index is built without blocking its writes
    # (concurrent_index.py), outside a transaction, so the column is committed first, and a re-run
    # after a failed build finds it there.
    op.execute('ALTER TABLE usage_records ADD COLUMN IF NOT EXISTS record_uid VARCHAR(32)')
    concurrent_index.create(INDEX, 'usage_records', ['record_uid'], unique=True)


def downgrade() -> None:
    if op.get_bind().dialect.name == 'postgresql':
        concurrent_index.drop(INDEX)
        op.execute('ALTER TABLE usage_records DROP COLUMN IF EXISTS record_uid')
        return
    with op.batch_alter_table('usage_records', schema=None) as batch_op:
        batch_op.drop_index(INDEX)
        batch_op.drop_column('record_uid')
