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


def upgrade() -> None:
    # A nullable column: existing rows keep NULL, which a unique index allows any number of times
    # (PostgreSQL and SQLite alike). The previous release inserts without it and keeps running.
    with op.batch_alter_table('usage_records', schema=None) as batch_op:
        batch_op.add_column(sa.Column('record_uid', sa.String(length=32), nullable=True))
        batch_op.create_index('ux_usage_record_uid', ['record_uid'], unique=True)


def downgrade() -> None:
    with op.batch_alter_table('usage_records', schema=None) as batch_op:
        batch_op.drop_index('ux_usage_record_uid')
        batch_op.drop_column('record_uid')
