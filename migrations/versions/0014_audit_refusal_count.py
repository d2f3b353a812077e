"""audit refusal count: a refusal repeated within a minute adds one to a count instead of a row

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03 01:00:00
"""
from alembic import op
import sqlalchemy as sa

from migrations import concurrent_index


revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None

INDEX = 'ux_audit_log_fold_key'
GUARD_FUNCTION = 'arbiter_audit_log_append_only'  # 0010's, replaced here
GUARD_TRIGGER = 'audit_log_append_only'           # 0010's: UPDATE or DELETE; DELETE only from here
COUNT_TRIGGER = 'audit_log_count_only'             # UPDATE, row by row: the count may grow, nothing else

# 0010's function, for the downgrade.
REFUSE_ALL = """
    CREATE OR REPLACE FUNCTION arbiter_audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION 'the audit log is append-only: % is refused', TG_OP
            USING ERRCODE = 'insufficient_privilege';
    END
    $$
"""

# An UPDATE passes only row by row, only when the count grows and every other column (compared as
# jsonb: the details column is json, which has no equality) stays as it was.
REFUSE_BUT_COUNT = """
    CREATE OR REPLACE FUNCTION arbiter_audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'UPDATE' AND TG_LEVEL = 'ROW' AND NEW.count > OLD.count
                AND (to_jsonb(NEW) - 'count') = (to_jsonb(OLD) - 'count') THEN
            RETURN NEW;
        END IF;
        RAISE EXCEPTION 'the audit log is append-only: % is refused', TG_OP
            USING ERRCODE = 'insufficient_privilege';
    END
    $$
"""


def upgrade() -> None:
    # Two columns the previous release never names: its inserts take the count's default (1) and
    # no fold key, and it never updates, so it keeps running beside this one.
    if op.get_bind().dialect.name != 'postgresql':
        with op.batch_alter_table('audit_log', schema=None) as batch_op:
            batch_op.add_column(sa.Column('count', sa.Integer(), server_default='1', nullable=False))
            batch_op.add_column(sa.Column('fold_key', sa.String(length=64), nullable=True))
            batch_op.create_index(INDEX, ['fold_key'], unique=True)
        return
    # The columns are committed before the index is built outside a transaction (as 0008): a re-run
    # after a failed build finds them there. A constant default adds no rewrite of the table.
    op.execute('ALTER TABLE audit_log ADD COLUMN IF NOT EXISTS count INTEGER NOT NULL DEFAULT 1')
    op.execute('ALTER TABLE audit_log ADD COLUMN IF NOT EXISTS fold_key VARCHAR(64)')
    concurrent_index.create(INDEX, 'audit_log', ['fold_key'], unique=True)  # the log can be large
    # INSERT ... ON CONFLICT DO UPDATE fires the statement-level UPDATE trigger of 0010 even when
    # it updates nothing: UPDATE is checked row by row from here, DELETE stays refused outright.
    op.execute(REFUSE_BUT_COUNT)
    op.execute(f"DROP TRIGGER IF EXISTS {GUARD_TRIGGER} ON audit_log")
    op.execute(f"CREATE TRIGGER {GUARD_TRIGGER} BEFORE DELETE ON audit_log "
               f"FOR EACH STATEMENT EXECUTE FUNCTION {GUARD_FUNCTION}()")
    op.execute(f"DROP TRIGGER IF EXISTS {COUNT_TRIGGER} ON audit_log")
    op.execute(f"CREATE TRIGGER {COUNT_TRIGGER} BEFORE UPDATE ON audit_log "
               f"FOR EACH ROW EXECUTE FUNCTION {GUARD_FUNCTION}()")


def downgrade() -> None:
    if op.get_bind().dialect.name == 'postgresql':
        op.execute(f"DROP TRIGGER IF EXISTS {COUNT_TRIGGER} ON audit_log")
        op.execute(f"DROP TRIGGER IF EXISTS {GUARD_TRIGGER} ON audit_log")
        op.execute(REFUSE_ALL)
        op.execute(f"CREATE TRIGGER {GUARD_TRIGGER} BEFORE UPDATE OR DELETE ON audit_log "
                   f"FOR EACH STATEMENT EXECUTE FUNCTION {GUARD_FUNCTION}()")
        concurrent_index.drop(INDEX)
    else:
        with op.batch_alter_table('audit_log', schema=None) as batch_op:
            batch_op.drop_index(INDEX)
    with op.batch_alter_table('audit_log', schema=None) as batch_op:
        batch_op.drop_column('fold_key')
        batch_op.drop_column('count')
