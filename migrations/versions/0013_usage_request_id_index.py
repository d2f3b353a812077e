"""usage request id index: find a request by the X-Request-Id its caller got

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02 04:00:00
"""
from alembic import op

from migrations import concurrent_index


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
    concurrent_index.create(INDEX, 'usage_records', ['request_id'])  # as 0008: writers go on


def downgrade() -> None:
    if op.get_bind().dialect.name == 'postgresql':
        concurrent_index.drop(INDEX)
        return
    with op.batch_alter_table('usage_records', schema=None) as batch_op:
        batch_op.drop_index(INDEX)
