"""deployment secrets: a random per-deployment secret behind the cache salt when no secret is set

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06 05:00:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A new table: the previous release never reads it, so it can keep running meanwhile.
    op.create_table('deployment_secrets',
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('value', sa.String(length=200), nullable=False),
    sa.PrimaryKeyConstraint('name')
    )


def downgrade() -> None:
    op.drop_table('deployment_secrets')
