"""ui sessions kept on the server; the caller's request id in the audit log; on PostgreSQL the
audit log refuses UPDATE and DELETE

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02 01:00:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None

GUARD_FUNCTION = 'arbiter_audit_log_append_only'
GUARD_TRIGGER = 'audit_log_append_only'


def upgrade() -> None:
    # A new table and a nullable column: the previous release never reads the table, inserts
    # audit rows without the column, and never updates or deletes audit rows, so it keeps running.
    op.create_table('ui_sessions',
    sa.Column('digest', sa.String(length=64), nullable=False),
    sa.Column('key_id', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('last_seen_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['key_id'], ['api_keys.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('digest')
    )
    with op.batch_alter_table('ui_sessions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_ui_sessions_key_id'), ['key_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_ui_sessions_expires_at'), ['expires_at'], unique=False)
    with op.batch_alter_table('audit_log', schema=None) as batch_op:
        batch_op.add_column(sa.Column('client_request_id', sa.String(length=64), nullable=True))
    if op.get_bind().dialect.name == 'postgresql':
        # Against Arbiter's own role and mistakes, not a DBA: the owner of the table (or a
        # superuser) can still drop the trigger. TRUNCATE is not covered (it needs its own
        # privilege, which the app's role need not have; see docs/admin.md).
        op.execute(f"""
            CREATE OR REPLACE FUNCTION {GUARD_FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                RAISE EXCEPTION 'the audit log is append-only: % is refused', TG_OP
                    USING ERRCODE = 'insufficient_privilege';
            END
            $$
        """)
        op.execute(f"CREATE TRIGGER {GUARD_TRIGGER} BEFORE UPDATE OR DELETE ON audit_log "
                   f"FOR EACH STATEMENT EXECUTE FUNCTION {GUARD_FUNCTION}()")


def downgrade() -> None:
    if op.get_bind().dialect.name == 'postgresql':
        op.execute(f"DROP TRIGGER IF EXISTS {GUARD_TRIGGER} ON audit_log")
        op.execute(f"DROP FUNCTION IF EXISTS {GUARD_FUNCTION}()")
    with op.batch_alter_table('audit_log', schema=None) as batch_op:
        batch_op.drop_column('client_request_id')
    with op.batch_alter_table('ui_sessions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_ui_sessions_expires_at'))
        batch_op.drop_index(batch_op.f('ix_ui_sessions_key_id'))
    op.drop_table('ui_sessions')
