"""What the `local` service's backends share: a model run inside the Arbiter process, on one
worker thread of its own, that answers decisions through a read strategy (label reading or
embeddings) rather than an HTTP endpoint. No credential, no HTTP, nothing to forward."""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson

from infra_adapters.base import BackendProtocolError, CallOptions, Reply, ReplyNotOk, Stream

T = TypeVar("T")
# Calls one project may have waiting for one model's thread (a 64-question calibrated label
# reading queues 256 reads at once); past it a 429 with Retry-After.
QUEUED_PER_PROJECT = 512
RETRY_AFTER = "1"
SERVED_KEPT = 1024  # projects whose last turn is remembered (those waiting always are)


class InProcessBackend:
    """The Backend protocol's HTTP side answered for a model in the process: ``systemone`` is a
    501 that says how the model answers instead (the forwarding path then takes its read
    strategy), and no public API is routed to it. Its work runs on one thread (``run``), so the
    event loop never blocks and calls never share the engine at once; calls wait for it in turn
    across projects (``FairQueue``), so one project's backlog never stands in front of another's."""

    kind = "local"
    name = "the local model"  # for messages: "the local runtime", "the local e5 model"
    answers_by = "its read strategy"  # how it answers decisions: "label reading", "embeddings"
    thread_name = "arbiter-local"

    def __init__(self, url: str) -> None:
        self.url = url
        self.queue = FairQueue(QUEUED_PER_PROJECT, self.thread_name)

    @property
    def has_credential(self) -> bool:
        return False

    def rejected_own_credential(self, answer: Reply | Stream) -> bool:
        return False  # no credential, no HTTP

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={self.url!r})"

    async def systemone(self, body: dict[str, Any], options: CallOptions) -> Reply:
        return Reply(501, "application/json", f'{{"error": "{self.name} answers decisions by {self.answers_by}"}}'
                     .encode())

    def decisions_unsupported(self, reply: Reply) -> bool:
        return reply.status == 501

    def route(self, api: str) -> str | None:
        return None  # no chat, no HTTP: it serves decisions through its read strategy

    async def open(self, path: str, body: dict[str, Any], options: CallOptions) -> Any:
        raise BackendProtocolError(f"{self.name} serves decisions only")

    async def run(self, work: Callable[..., T], *args: Any, project: str | None = None) -> T:
        """``work(*args)`` on the model's thread, in ``project``'s turn (``CallOptions.project_key``;
        None for work of no request's, such as reading the tokenizer). A project with
        ``QUEUED_PER_PROJECT`` calls waiting already gets a 429 with Retry-After."""
        try:
            future = self.queue.submit(project, work, *args)
        except QueueFull:
            body = orjson.dumps({"error": f"{self.name} has {self.queue.per_project} calls of this project waiting "
                                          "already; retry after a second, or send fewer requests at once",
                                 "detail": {"error_type": "rate_limit_error"}})
            raise ReplyNotOk(Reply(429, "application/json", body, retry_after=RETRY_AFTER)) from None
        return await asyncio.wrap_future(future)

    async def aclose(self) -> None:
        self.queue.close()


class QueueFull(Exception):
    """A project has ``per_project`` calls waiting for the model already."""


class FairQueue:
    """The calls waiting for one model's thread, taken in turn across projects (issue 30): each
    project has a FIFO of its own, and the thread, each time it is free, serves the head of the
    waiting project it served least recently (one it never served first, in order of arrival). A
    project's backlog therefore delays another's call by at most the one call running. Each
    project may have ``per_project`` calls waiting; past it ``submit`` raises ``QueueFull``.

    The thread is a one-worker ``ThreadPoolExecutor`` (joined at interpreter exit as any
    executor's) given one call at a time."""

    def __init__(self, per_project: int, thread_name: str) -> None:
        self.per_project = per_project
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=thread_name)
        self._lock = threading.Lock()
        self._waiting: dict[str | None, collections.deque[_Call]] = {}
        self._served: dict[str | None, int] = {}  # project -> the turn it was last served at
        self._turn = 0
        self._busy = self._closed = False

    def waiting(self, project: str | None) -> int:
        with self._lock:
            return len(self._waiting.get(project, ()))

    def submit(self, project: str | None, work: Callable[..., Any], *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the model's thread is closed")
            queue = self._waiting.setdefault(project, collections.deque())
            if len(queue) >= self.per_project:
                if not queue:
                    del self._waiting[project]
                raise QueueFull
            queue.append(_Call(future, work, args))
            if not self._busy:
                self._start_next()
        future.add_done_callback(lambda done: self._forget(project, done))
        return future

    def close(self) -> None:
        with self._lock:
            self._closed = True
            calls = [call for queue in self._waiting.values() for call in queue]
            self._waiting.clear()
        for call in calls:
            call.future.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _forget(self, project: str | None, done: Future[Any]) -> None:
        """A call cancelled while it waits (its request timed out or hung up) leaves its queue at
        once: it no longer counts against its project's bound."""
        if not done.cancelled():
            return
        with self._lock:
            queue = self._waiting.get(project)
            if queue is None:
                return
            for call in queue:
                if call.future is done:
                    queue.remove(call)
                    break
            if not queue:
                del self._waiting[project]

    def _start_next(self) -> None:
        """Hands the thread the next call (with ``_lock`` held), or marks it idle."""
        while self._waiting and not self._closed:
            project = min(self._waiting, key=lambda p: self._served.get(p, -1))
            queue = self._waiting[project]
            call = queue.popleft()
            if not queue:
                del self._waiting[project]
            self._turn += 1
            self._served[project] = self._turn
            if len(self._served) > SERVED_KEPT:  # forgotten, an idle project is first in turn again: as it was
                self._served = {p: turn for p, turn in self._served.items() if p in self._waiting or p == project}
            if call.future.set_running_or_notify_cancel():
                self._busy = True
                self._executor.submit(self._execute, call)
                return
        self._busy = False

    def _execute(self, call: _Call) -> None:
        try:
            result = call.work(*call.args)
        except BaseException as exc:  # noqa: BLE001 - the caller's future carries it
            call.future.set_exception(exc)
        else:
            call.future.set_result(result)
        finally:
            with self._lock:
                self._start_next()


@dataclass(slots=True)
class _Call:
    future: Future[Any]
    work: Callable[..., Any]
    args: tuple[Any, ...]
