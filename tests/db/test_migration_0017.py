"""0017: the usage rollups, built from the records already there (on PostgreSQL a day at a time),
the same as the ledger would have kept; and taken off again."""

from __future__ import annotations

import datetime as dt

from alembic import command
from sqlalchemy import MetaData, insert, text

from app.db import migrate, rollups
from app.db.models import UsageRecord
from app.telemetry import retention
from tests.db.test_migrations import engine_of, fresh_url  # noqa: F401 - fresh_url: a fixture

# The table before 0018 (usage_ledger's columns, under its name then).
LEGACY = UsageRecord.__table__.to_metadata(MetaData(), name="usage_records")


def test_0017_rolls_up_the_records_already_there(fresh_url: str) -> None:  # noqa: F811
    config = migrate.alembic_config(fresh_url)
    command.upgrade(config, "0014")
    engine = engine_of(fresh_url)
    rows = [(dt.datetime(2025, 3, day, hour, 10 * n, tzinfo=dt.UTC), status, latency)
            for day in (1, 2, 4) for hour in (0, 23) for n, (status, latency) in enumerate(
                [(200, 0.05), (200, rollups.LATENCY_EDGES[30]), (503, 1200.0), (429, 12.5)])]
    try:
        with engine.begin() as connection:  # rows of the previous release (its columns are today's)
            connection.execute(insert(LEGACY), [
                {"at": at, "request_id": f"r{i}", "operation": "decision", "model": "nimble", "status": status,
                 "input_tokens": 3, "output_tokens": 1, "latency_ms": latency, "project_id": None,
                 "alias": "fast" if i % 2 else None} for i, (at, status, latency) in enumerate(rows)])
        command.upgrade(config, "0017")
        with engine.connect() as connection:
            kept = connection.execute(text(
                "SELECT count(*), sum(requests), sum(input_tokens), sum(latency_ms) FROM usage_rollups")).one()
            bins = dict(connection.execute(text(
                "SELECT bin, sum(requests) FROM usage_latency_rollups GROUP BY bin")).all())
        assert kept[1:] == (24, 72, sum(latency for _, _, latency in rows))
        assert kept[0] == 24  # an hour, a status and an alias each: nothing to merge in this set
        assert bins == {0: 6, 30: 6, rollups.latency_bin(1200.0): 6, rollups.latency_bin(12.5): 6}
        command.upgrade(config, "0018")  # the rebuild reads the ledger: the rows moved there first
        if engine.dialect.name == "postgresql":
            assert retention.move_legacy_batch(engine) == 24
        with engine.begin() as connection:  # the same as a rebuild from the raw rows gives
            everything = text("SELECT * FROM usage_rollups ORDER BY 1, 2, 3, 4, 5, 6, 7, 8")
            before = connection.execute(everything).all()
            rollups.rebuild(connection, dt.datetime(2025, 3, 1, tzinfo=dt.UTC), dt.datetime(2025, 3, 5, tzinfo=dt.UTC))
            assert connection.execute(everything).all() == before
        command.downgrade(config, "0014")  # (0018's downgrade puts the rows back into usage_records)
        command.upgrade(config, "0017")  # and up again, counting the same
        with engine.connect() as connection:
            assert connection.execute(text("SELECT sum(requests) FROM usage_rollups")).scalar() == 24
    finally:
        engine.dispose()
