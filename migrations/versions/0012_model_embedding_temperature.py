"""model embedding_temperature: the softmax temperature of the embeddings read strategy

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02 03:00:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A nullable column without a default (null: the calibrated default): the previous release
    # never reads it and keeps running beside this one; a catalog change only on PostgreSQL.
    with op.batch_alter_table('models', schema=None) as batch_op:
        batch_op.add_column(sa.Column('embedding_temperature', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('models', schema=None) as batch_op:
        batch_op.drop_column('embedding_temperature')
