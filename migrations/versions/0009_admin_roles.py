"""admin roles: an admin key's role, and the projects a project-admin key may manage

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 00:00:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable columns: the previous release inserts admin keys without them and keeps running.
    # A NULL role on an admin key reads as `owner` (every admin key could do everything before).
    with op.batch_alter_table('api_keys', schema=None) as batch_op:
        batch_op.add_column(sa.Column('role', sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column('admin_projects', sa.JSON(), nullable=True))
    op.execute("UPDATE api_keys SET role = 'owner' WHERE kind = 'admin' AND role IS NULL")


def downgrade() -> None:
    with op.batch_alter_table('api_keys', schema=None) as batch_op:
        batch_op.drop_column('admin_projects')
        batch_op.drop_column('role')
