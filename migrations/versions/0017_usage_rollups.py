"""usage rollups: per-hour totals of the ledger, kept as records are written, read by every report

Revision ID: 0017
Revises: 0015
Create Date: 2026-12-10 01:00:00

The tables, then the rollups of every record already there.

What it costs: one pass over ``usage_records`` (two GROUP BYs per UTC day, the day's rows read
through ``ix_usage_at``). On PostgreSQL a day at a time, each statement committed on its own
(autocommit), so a large table never holds one long transaction, and a failed run, run again,
makes every day whole (a day's rollups are deleted before they are written). Measured by
bench/ledger.py (docs/performance.md): about 12 s per million rows on 2 shared cores, so about
2 minutes for 10 M rows; the rollups hold at most a row per hour and project, key, model, alias,
operation, provider and status. The previous release goes on writing records meanwhile and does not roll
them up: once it is gone, ``arbiter usage rollup --since <the upgrade's day>`` counts those.
"""
import datetime as dt

from alembic import op
import sqlalchemy as sa


revision = '0017'
down_revision = '0015'
branch_labels = None
depends_on = None

# app/db/rollups.py's LATENCY_EDGES, frozen here: the bins these rollups were counted with.
EDGES = tuple(float(f"{0.1 * 2 ** (i / 8):.6g}") for i in range(181))
KEY = ['hour', 'project_id', 'key_id', 'model', 'alias', 'operation', 'provider', 'status']


def _bin(dialect: str, low: int = 0, high: int = len(EDGES)) -> str:
    if high - low == 1:
        return str(low)
    middle = (low + high) // 2
    edge = f'CAST({EDGES[middle]!r} AS DOUBLE PRECISION)' if dialect == 'postgresql' else repr(EDGES[middle])
    return f'CASE WHEN latency_ms < {edge} THEN {_bin(dialect, low, middle)} ELSE {_bin(dialect, middle, high)} END'


def _hour(dialect: str) -> str:
    if dialect == 'postgresql':
        return "timezone('UTC', date_trunc('hour', timezone('UTC', at)))"
    return "strftime('%Y-%m-%d %H:00:00.000000', at)"


def _fill(dialect: str, where: str) -> list[str]:
    """The INSERT ... SELECTs of the rollups of the records ``where`` picks."""
    hour = _hour(dialect)
    dims = (f"{hour}, COALESCE(project_id, 0), COALESCE(key_id, 0), model, COALESCE(alias, ''), operation, "
            "COALESCE(provider, ''), status")
    bin_ = _bin(dialect)
    return [
        f"INSERT INTO usage_rollups ({', '.join(KEY)}, requests, input_tokens, output_tokens, latency_ms) "
        f"SELECT {dims}, count(*), COALESCE(sum(input_tokens), 0), COALESCE(sum(output_tokens), 0), "
        f"sum(latency_ms) FROM usage_records WHERE {where} GROUP BY {dims}",
        "INSERT INTO usage_latency_rollups (hour, project_id, bin, requests, low, high) "
        f"SELECT {hour}, COALESCE(project_id, 0), {bin_}, count(*), min(latency_ms), max(latency_ms) "
        f"FROM usage_records WHERE {where} GROUP BY {hour}, COALESCE(project_id, 0), {bin_}",
    ]


def upgrade() -> None:
    bind = op.get_bind()
    as_sql = op.get_context().as_sql
    if as_sql or not sa.inspect(bind).has_table('usage_rollups'):  # a re-run after a failed fill: made
        op.create_table(
            'usage_rollups',
            sa.Column('hour', sa.DateTime(timezone=True), nullable=False),
            sa.Column('project_id', sa.Integer(), nullable=False),
            sa.Column('key_id', sa.Integer(), nullable=False),
            sa.Column('model', sa.String(length=200), nullable=False),
            sa.Column('alias', sa.String(length=200), nullable=False),
            sa.Column('operation', sa.String(length=32), nullable=False),
            sa.Column('provider', sa.String(length=32), nullable=False),
            sa.Column('status', sa.Integer(), nullable=False),
            sa.Column('requests', sa.BigInteger(), nullable=False),
            sa.Column('input_tokens', sa.BigInteger(), nullable=False),
            sa.Column('output_tokens', sa.BigInteger(), nullable=False),
            sa.Column('latency_ms', sa.Float(), nullable=False),
            sa.PrimaryKeyConstraint(*KEY),
        )
        op.create_index('ix_usage_rollups_project_hour', 'usage_rollups', ['project_id', 'hour'])
        op.create_table(
            'usage_latency_rollups',
            sa.Column('hour', sa.DateTime(timezone=True), nullable=False),
            sa.Column('project_id', sa.Integer(), nullable=False),
            sa.Column('bin', sa.Integer(), nullable=False),
            sa.Column('requests', sa.BigInteger(), nullable=False),
            sa.Column('low', sa.Float(), nullable=False),
            sa.Column('high', sa.Float(), nullable=False),
            sa.PrimaryKeyConstraint('hour', 'project_id', 'bin'),
        )
        op.create_index('ix_usage_latency_rollups_project_hour', 'usage_latency_rollups', ['project_id', 'hour'])
    if as_sql:  # `alembic upgrade --sql`: the whole fill in one go
        for statement in _fill(bind.dialect.name, 'true'):
            op.execute(statement)
        return
    if bind.dialect.name != 'postgresql':  # SQLite: one transaction, one pass
        op.execute('DELETE FROM usage_rollups')
        op.execute('DELETE FROM usage_latency_rollups')
        for statement in _fill(bind.dialect.name, '1 = 1'):
            op.execute(statement)
        return
    first, last = bind.execute(sa.text('SELECT min(at), max(at) FROM usage_records')).one()
    with op.get_context().autocommit_block():
        timeout = bind.execute(sa.text('SHOW statement_timeout')).scalar()
        op.execute('SET statement_timeout = 0')  # a day of many millions of rows takes its time
        try:
            day = first.astimezone(dt.UTC).date() if first is not None else None
            while day is not None and day <= last.astimezone(dt.UTC).date():
                start = dt.datetime.combine(day, dt.time(), dt.UTC)
                window = {'start': start, 'end': start + dt.timedelta(days=1)}
                # Each statement commits on its own; the day's rollups are emptied first, so a
                # run stopped half way through a day is made whole by the next.
                for table in ('usage_rollups', 'usage_latency_rollups'):
                    bind.execute(sa.text(f'DELETE FROM {table} WHERE hour >= :start AND hour < :end'), window)
                for statement in _fill('postgresql', 'at >= :start AND at < :end'):
                    bind.execute(sa.text(statement), window)
                day += dt.timedelta(days=1)
        finally:
            bind.execute(sa.text("SELECT set_config('statement_timeout', :value, false)"), {'value': timeout})


def downgrade() -> None:
    op.drop_index('ix_usage_latency_rollups_project_hour', table_name='usage_latency_rollups')
    op.drop_table('usage_latency_rollups')
    op.drop_index('ix_usage_rollups_project_hour', table_name='usage_rollups')
    op.drop_table('usage_rollups')
