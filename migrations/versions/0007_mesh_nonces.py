"""mesh nonces

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 09:00:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A new table: the previous release never reads it, so it can keep running meanwhile.
    op.create_table('mesh_nonces',
    sa.Column('nonce', sa.String(length=32), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('nonce')
    )
    with op.batch_alter_table('mesh_nonces', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_mesh_nonces_expires_at'), ['expires_at'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('mesh_nonces', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_mesh_nonces_expires_at'))
    op.drop_table('mesh_nonces')
