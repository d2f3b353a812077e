"""What the `local` service's backends share: a model run inside the Arbiter process, on one
worker thread of its own, that answers decisions through a read strategy (label reading or
embeddings) rather than an HTTP endpoint. No credential, no HTTP, nothing to forward."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from infra_adapters.base import BackendProtocolError, CallOptions, Reply, Stream

T = TypeVar("T")


class InProcessBackend:
    """The Backend protocol's HTTP side answered for a model in the process: ``systemone`` is a
    501 that says how the model answers instead (the forwarding path then takes its read
    strategy), and no public API is routed to it. Its work runs on one thread (``run``), so the
    event loop never blocks and calls never share the engine at once."""

    kind = "local"
    name = "the local model"  # for messages: "the local runtime", "the local e5 model"
    answers_by = "its read strategy"  # how it answers decisions: "label reading", "embeddings"
    thread_name = "arbiter-local"

    def __init__(self, url: str) -> None:
        self.url = url
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.thread_name)

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

    async def run(self, work: Callable[..., T], *args: Any) -> T:
        """``work(*args)`` on the model's thread."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, work, *args)

    async def aclose(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
