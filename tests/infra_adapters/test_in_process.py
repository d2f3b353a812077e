"""The thread of a model run inside Arbiter (infra_adapters/in_process.py), shared by the local e5
and the local llama.cpp backends: calls wait for it in turn across projects, each project's queue
bounded (issue 30: one tenant's backlog stood in front of everyone, a tiny request waited 72 s)."""

from __future__ import annotations

import asyncio
import threading

import orjson
import pytest

from infra_adapters.base import ReplyNotOk
from infra_adapters.in_process import FairQueue, InProcessBackend


class Slow:
    """Work that records who it ran for; the first call waits until released."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.release = threading.Event()
        self.started = threading.Event()

    def __call__(self, who: str) -> str:
        if not self.ran:
            self.started.set()
            assert self.release.wait(30)
        self.ran.append(who)
        return who


def test_one_projects_backlog_delays_another_by_at_most_one_call() -> None:
    backend, work = InProcessBackend("package:test"), Slow()

    async def scene() -> list[str]:
        calls = [asyncio.ensure_future(backend.run(work, f"a{i}", project="A")) for i in range(6)]
        await asyncio.sleep(0)  # every call of A is queued (the first holds the thread)
        calls.append(asyncio.ensure_future(backend.run(work, "b0", project="B")))
        calls.append(asyncio.ensure_future(backend.run(work, "c0", project="C")))
        await asyncio.sleep(0)
        work.release.set()
        return list(await asyncio.gather(*calls))

    try:
        answers = asyncio.run(scene())
    finally:
        asyncio.run(backend.aclose())
    assert answers == [*(f"a{i}" for i in range(6)), "b0", "c0"]  # each caller gets its own answer
    # A's first call was running when B and C came: each of them waited for it alone, not for A's
    # backlog (first in, first out, they would have run last).
    assert work.ran[:3] == ["a0", "b0", "c0"] and work.ran[3:] == [f"a{i}" for i in range(1, 6)]


def test_projects_take_turns_while_each_has_calls_waiting() -> None:
    queue, work = FairQueue(per_project=8, thread_name="arbiter-test"), Slow()
    try:
        futures = [queue.submit("A", work, "a0")]
        futures += [queue.submit("A", work, f"a{i}") for i in range(1, 4)]
        futures += [queue.submit("B", work, f"b{i}") for i in range(3)]
        work.release.set()
        for future in futures:
            future.result(30)
    finally:
        queue.close()
    assert work.ran == ["a0", "b0", "a1", "b1", "a2", "b2", "a3"]


def test_a_project_over_its_queue_bound_gets_a_429_and_others_do_not() -> None:
    backend, work = InProcessBackend("package:test"), Slow()
    backend.queue.per_project = 2

    async def scene() -> tuple[ReplyNotOk, list[str]]:
        held = asyncio.ensure_future(backend.run(work, "a0", project="A"))  # running: not waiting
        waiting = [asyncio.ensure_future(backend.run(work, f"a{i}", project="A")) for i in (1, 2)]
        await asyncio.sleep(0)
        with pytest.raises(ReplyNotOk) as refused:
            await backend.run(work, "a3", project="A")
        others = asyncio.ensure_future(backend.run(work, "b0", project="B"))
        await asyncio.sleep(0)
        work.release.set()
        return refused.value, list(await asyncio.gather(held, *waiting, others))

    try:
        refused, answers = asyncio.run(scene())
    finally:
        asyncio.run(backend.aclose())
    assert refused.reply.status == 429 and refused.reply.retry_after == "1"
    message = orjson.loads(refused.reply.body)["error"]
    assert "2 calls of this project waiting" in message and "retry" in message
    assert answers == ["a0", "a1", "a2", "b0"] and "a3" not in work.ran


def test_a_call_cancelled_while_it_waits_leaves_its_queue_and_never_runs() -> None:
    queue, work = FairQueue(per_project=2, thread_name="arbiter-test"), Slow()
    try:
        running = queue.submit("A", work, "a0")
        assert work.started.wait(30)
        gone = queue.submit("A", work, "a1")
        kept = queue.submit("A", work, "a2")
        assert queue.waiting("A") == 2
        assert gone.cancel()  # its request timed out or its client hung up
        assert queue.waiting("A") == 1
        queue.submit("A", work, "a3")  # the bound counts only calls still wanted
        work.release.set()
        running.result(30), kept.result(30)
    finally:
        queue.close()
    assert "a1" not in work.ran


def test_closing_cancels_the_calls_still_waiting() -> None:
    queue, work = FairQueue(per_project=4, thread_name="arbiter-test"), Slow()
    running = queue.submit(None, work, "x0")
    assert work.started.wait(30)
    waiting = queue.submit(None, work, "x1")
    queue.close()
    work.release.set()
    assert running.result(30) == "x0" and waiting.cancelled()
    with pytest.raises(RuntimeError):
        queue.submit(None, work, "x2")
