"""Big request bodies are measured and decoded in a small pool of worker threads, never on the
event loop: a body of megabytes takes tens to hundreds of milliseconds to decode, and every other
request (``/healthz`` included) would wait that long. Small bodies stay on the loop, where a
thread hop would cost more than their decode (the hot path's body is ~1.6 KB)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

OFF_LOOP_BYTES = 64 * 1024  # over this, decoded in a worker: ~7 ms of loop for 64 KiB of ``{}``
WORKERS = 2  # bounds the memory of decodes under way, and leaves the cores to the loop

T = TypeVar("T")


class OffLoop:
    """A dedicated pool (not asyncio's default one, which key lookups and database writes use).
    Its threads start with the first big body and stay for the life of the process."""

    def __init__(self, workers: int = WORKERS) -> None:
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="arbiter-body")

    async def run(self, work: Callable[..., T], *args: Any) -> T:
        """``work(*args)`` in the pool (a body's decode: ``run(jsonbody.loads, raw)``)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, work, *args)
