"""model aliases: a second public name for a model; the alias a usage record's caller named

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02 02:00:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A new table and a nullable column: the previous release never reads the table and inserts
    # usage rows without the column (NULL, no alias), so it keeps running beside this one. Adding
    # a nullable column without a default is a catalog change on PostgreSQL (no table rewrite).
    op.create_table('model_aliases',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('target', sa.String(length=200), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('name')
    )
    with op.batch_alter_table('usage_records', schema=None) as batch_op:
        batch_op.add_column(sa.Column('alias', sa.String(length=200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('usage_records', schema=None) as batch_op:
        batch_op.drop_column('alias')
    op.drop_table('model_aliases')
