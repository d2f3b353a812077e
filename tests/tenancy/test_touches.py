"""Keys' last_used_at: noted in memory per request, written in batches, flushed on shutdown."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import select

from app.db.models import ApiKey
from tests.support import Stack, decision


def last_used(stack: Stack) -> Any:
    with stack.db.session() as session:
        return session.scalar(select(ApiKey.last_used_at).where(ApiKey.kind == "project"))


def test_last_used_at_is_written_in_the_background(stack: Stack) -> None:
    assert last_used(stack) is None
    with stack.client() as client:
        assert client.post("/v1/systemone", json=decision()).status_code == 200
    deadline = time.monotonic() + 15
    while last_used(stack) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert last_used(stack) is not None


def test_pending_touches_are_flushed_on_shutdown(stack: Stack, gateway_factory: Any) -> None:
    slow = gateway_factory(flush_interval=3600)  # the timer never fires within the test
    with slow.client(stack.project_key) as client:
        assert client.post("/v1/systemone", json=decision()).status_code == 200
    assert last_used(stack) is None
    slow.stop()
    assert last_used(stack) is not None


def test_many_requests_make_one_write(stack: Stack, gateway_factory: Any) -> None:
    slow = gateway_factory(flush_interval=3600)
    writes: list[int] = []
    touches = slow.app.components.touches
    original = touches._write
    touches._write = lambda batch: (writes.append(len(batch)), original(batch))[1]  # type: ignore[method-assign]
    with slow.client(stack.project_key) as client:
        for _ in range(20):
            assert client.post("/v1/systemone", json=decision()).status_code == 200
    slow.stop()
    assert writes == [1]  # twenty requests, one key, one row written once


def test_last_used_at_never_goes_backwards(db: Any) -> None:
    """Two replicas write their own batches: the one with the older use may come second."""
    import datetime as dt

    from app.db.timestamps import as_utc
    from app.tenancy import service as tenancy

    stack = Stack.provision(db)
    with db.session() as session:
        key_id = session.scalar(select(ApiKey.id).where(ApiKey.kind == "project"))
    newer, older = dt.datetime(2026, 1, 2, tzinfo=dt.UTC), dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    for at in (newer, older):
        with db.session() as session:
            tenancy.touch_keys(session, {key_id: at})
    assert as_utc(last_used(stack)) == newer


def test_the_final_flush_waits_for_a_write_the_timer_left_running(db: Any) -> None:
    import asyncio
    import threading

    from app.tenancy.touches import KeyTouches

    Stack.provision(db)
    touches = KeyTouches(db)
    started, done = threading.Event(), threading.Event()

    def slow(batch: Any) -> None:
        started.set()
        time.sleep(0.3)
        done.set()

    touches._write = slow  # type: ignore[method-assign]

    async def shutdown() -> bool:
        touches.touch(1)
        task = asyncio.create_task(touches.run(0.01))
        while not started.is_set():
            await asyncio.sleep(0.01)
        task.cancel()  # as Components.stop does
        await asyncio.gather(task, return_exceptions=True)
        await touches.flush()
        return done.is_set()  # before the database is disposed

    assert asyncio.run(shutdown())
