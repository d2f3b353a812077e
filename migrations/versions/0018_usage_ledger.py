"""usage ledger: the usage records in a table partitioned by UTC day on PostgreSQL

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-12 01:00:00

PostgreSQL: a new table, ``usage_ledger``, PARTITION BY RANGE (at), a partition per UTC day and a
DEFAULT one, so retention drops a day whole (app/telemetry/retention.py) instead of deleting rows.
``usage_records`` is left as it is, unlocked: the previous release goes on inserting into it by name
during a rolling upgrade (with ``ON CONFLICT (record_uid)``, which a partitioned table cannot
serve). Its rows are moved into ``usage_ledger`` by the maintenance job, in batches, keeping their
ids: the new table draws them from the old table's sequence. Nothing here reads or rewrites the
records, so this takes milliseconds whatever their number. The rollups (0017) count both.

SQLite: ``usage_records`` is renamed (no partitions; retention deletes rows in batches).

Both: the record uid is unique with ``at`` (a unique index of a partitioned table holds its
partition key; a record's ``at`` is fixed when it is made, so a replayed batch adds nothing twice).
"""
import datetime as dt

from alembic import op
import sqlalchemy as sa


revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None

COLUMNS = ('id, at, request_id, project_id, key_id, operation, model, provider, status, input_tokens, '
           'output_tokens, latency_ms, record_uid, alias')
OLD_INDEXES = {'ix_usage_project_at': ['project_id', 'at'], 'ix_usage_at': ['at'],
               'ux_usage_record_uid': ['record_uid'], 'ix_usage_request_id': ['request_id']}
NEW_INDEXES = {'ix_usage_ledger_project_at': ['project_id', 'at'], 'ix_usage_ledger_at': ['at'],
               'ux_usage_ledger_record_uid': ['record_uid', 'at'], 'ix_usage_ledger_request_id': ['request_id']}
DAYS_BEHIND, DAYS_AHEAD = 1, 7  # as app/telemetry/retention.py keeps them


def upgrade() -> None:
    if op.get_bind().dialect.name != 'postgresql':
        _sqlite_up()
        return
    # The previous release's sequence, so an id is never given twice across the two tables.
    sequence = 'usage_records_id_seq'
    if not op.get_context().as_sql:
        sequence = op.get_bind().execute(sa.text("SELECT pg_get_serial_sequence('usage_records', 'id')")).scalar()
    op.execute(f"""
        CREATE TABLE usage_ledger (
            id BIGINT NOT NULL DEFAULT nextval('{sequence}'),
            at TIMESTAMP WITH TIME ZONE NOT NULL,
            request_id VARCHAR(64) NOT NULL,
            project_id INTEGER REFERENCES projects (id) ON DELETE SET NULL,
            key_id INTEGER REFERENCES api_keys (id) ON DELETE SET NULL,
            operation VARCHAR(32) NOT NULL,
            model VARCHAR(200) NOT NULL,
            provider VARCHAR(32),
            status INTEGER NOT NULL,
            input_tokens BIGINT NOT NULL,
            output_tokens BIGINT NOT NULL,
            latency_ms DOUBLE PRECISION NOT NULL,
            record_uid VARCHAR(32),
            alias VARCHAR(200),
            CONSTRAINT usage_ledger_pkey PRIMARY KEY (id, at)
        ) PARTITION BY RANGE (at)""")
    for name, columns in NEW_INDEXES.items():
        unique = 'UNIQUE ' if name.startswith('ux_') else ''
        op.execute(f"CREATE {unique}INDEX {name} ON usage_ledger ({', '.join(columns)})")
    op.execute('CREATE TABLE usage_ledger_default PARTITION OF usage_ledger DEFAULT')
    today = dt.datetime.now(dt.UTC).date()
    for offset in range(-DAYS_BEHIND, DAYS_AHEAD + 1):
        day = today + dt.timedelta(days=offset)
        op.execute(f"CREATE TABLE usage_ledger_p{day:%Y%m%d} PARTITION OF usage_ledger FOR VALUES "
                   f"FROM ('{day.isoformat()} 00:00:00+00') TO ('{day + dt.timedelta(days=1)} 00:00:00+00')")


def _sqlite_up() -> None:
    op.rename_table('usage_records', 'usage_ledger')
    for name in OLD_INDEXES:
        op.drop_index(name, table_name='usage_ledger')
    for name, columns in NEW_INDEXES.items():
        op.create_index(name, 'usage_ledger', columns, unique=name.startswith('ux_'))


def downgrade() -> None:
    if op.get_bind().dialect.name != 'postgresql':
        for name in NEW_INDEXES:
            op.drop_index(name, table_name='usage_ledger')
        op.rename_table('usage_ledger', 'usage_records')
        for name, columns in OLD_INDEXES.items():
            op.create_index(name, 'usage_records', columns, unique=name.startswith('ux_'))
        return
    # The records written since go back where the previous release reads them (ids kept).
    op.execute(f"INSERT INTO usage_records ({COLUMNS}) SELECT {COLUMNS} FROM usage_ledger ON CONFLICT DO NOTHING")
    op.execute('DROP TABLE usage_ledger')
