"""Times read back from the database. Arbiter stores UTC; SQLite drops the zone, so a naive
time read from it is UTC; PostgreSQL gives a time in its session's TimeZone, which need not be
UTC (a PGTZ, a role's or the server's setting)."""

from __future__ import annotations

import datetime as dt


def as_utc(value: dt.datetime) -> dt.datetime:
    """``value`` in UTC (a naive time is UTC: the database dropped the zone)."""
    return value.astimezone(dt.UTC) if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)


def iso(value: dt.datetime | None) -> str | None:
    """An ISO 8601 time with its zone, for a JSON view; None for none."""
    return as_utc(value).isoformat() if value else None
