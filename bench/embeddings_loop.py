"""How long the embeddings strategy holds the event loop (issue 30): concurrent requests whose
choices have many long options, against a ticker that records its own lateness, as /healthz
would wait. Run from a checkout: ``PYTHONPATH=. python bench/embeddings_loop.py [requests]``.
The embedder answers at once (one turn of the loop) with e5-sized vectors (384 dimensions), so what is measured is
Arbiter's own arithmetic. Prints the loop's worst, 99th-percentile and total lateness; asserts nothing (run it idle too:
``python -c`` the ticker alone gives the machine's own noise)."""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections.abc import Sequence

from app.routing.strategies import embeddings
from infra_adapters.embedders import Embedded, Role

DIM = 384


class Instant:
    async def embed(self, texts: Sequence[str], role: Role) -> Embedded:
        await asyncio.sleep(0)  # a real embedder's call suspends the request
        rng = random.Random(len(texts))
        return Embedded([[rng.uniform(-1, 1) for _ in range(DIM)] for _ in texts], [1] * len(texts))

    async def aclose(self) -> None:
        return None


async def ticker(stop: asyncio.Event, lateness: list[float]) -> None:
    while not stop.is_set():
        start = time.perf_counter()
        await asyncio.sleep(0.001)
        lateness.append(time.perf_counter() - start - 0.001)


async def main(requests: int) -> None:
    options = {f"option {i}": f"option {i} " + "is about something long " * 4 for i in range(255)}
    body = {"state": "s", "questions": {f"q{j}": {"type": "choice", "criteria": options} for j in range(4)}}
    cache = embeddings.PassageCache()
    await embeddings.decide(body, Instant(), cache)  # passages embedded once: the arithmetic is left
    stop, lateness = asyncio.Event(), list[float]()
    ticking = asyncio.create_task(ticker(stop, lateness))
    started = time.perf_counter()
    await asyncio.gather(*(embeddings.decide({**body, "state": f"s{i}"}, Instant(), cache) for i in range(requests)))
    took = time.perf_counter() - started
    stop.set()
    await ticking
    lateness.sort()
    print(f"{requests} requests of {4 * 255} options x {DIM} dimensions: {took * 1000:.0f} ms in all; "
          f"the loop's lateness: worst {lateness[-1] * 1000:.1f} ms, "
          f"99th percentile {lateness[len(lateness) * 99 // 100] * 1000:.1f} ms, total {sum(lateness) * 1000:.0f} ms")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 8))
