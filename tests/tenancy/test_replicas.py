"""Replicas counted from heartbeat rows in the leases table: the divisor of each rate limit while
Redis is away (app/tenancy/replicas.py)."""

from __future__ import annotations

import asyncio
import datetime as dt

from sqlalchemy import select

from app.db.models import Lease, utcnow
from app.db.session import Database
from app.tenancy.replicas import ReplicaCount


def test_live_heartbeats_are_counted_and_a_stopped_replica_is_not(db: Database) -> None:
    one, two = ReplicaCount(db, 0.2), ReplicaCount(db, 0.2)
    assert one.count == 1  # before any count
    one.beat()
    assert two.beat() == 2 and one.beat() == 2
    with db.session() as session:  # a replica gone without a goodbye, long ago and a moment ago
        session.add(Lease(name="replica:gone:1:old", holder="x", expires_at=utcnow() - dt.timedelta(hours=2)))
        session.add(Lease(name="replica:gone:2:new", holder="x", expires_at=utcnow() - dt.timedelta(seconds=1)))
        session.add(Lease(name="service-sync", holder="x", expires_at=utcnow() + dt.timedelta(minutes=1)))
    assert one.beat() == 2  # neither expired row nor another lease counts
    two.release()
    assert one.beat() == 1
    with db.session() as session:
        names = set(session.scalars(select(Lease.name)))
    assert names == {one.name, "replica:gone:2:new", "service-sync"}  # an hour-old row is deleted


def test_the_database_away_keeps_the_last_count(db: Database) -> None:
    ReplicaCount(db, 0.2).beat()
    counter = ReplicaCount(db, 0.05)
    assert counter.beat() == 2
    counter._database = Database("sqlite:////nonexistent/dir/arbiter.db")  # a database that cannot answer

    async def a_few_rounds() -> bool:
        task = asyncio.create_task(counter.run())
        await asyncio.sleep(0.3)
        alive = not task.done()  # a failing beat does not end the loop
        task.cancel()
        return alive

    assert asyncio.run(a_few_rounds()) and counter.count == 2
