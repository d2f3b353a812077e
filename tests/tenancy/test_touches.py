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
    deadline = time.monotonic() + 5
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
