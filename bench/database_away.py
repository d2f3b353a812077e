"""PostgreSQL cut for longer than the key cache's TTL under steady load: how many decisions fail.

    python bench/database_away.py --database-url postgresql://postgres@127.0.0.1:5432/NAME
                                  [--keys 20] [--rate 100] [--before 5] [--outage 30] [--after 10]
                                  [--ttl 2] [--stale 900]

One in-process gateway (tests/support.py) in front of an emulated Ollama, its database behind a
TCP proxy (tests/reliability/proxy.py) that is cut for ``--outage`` seconds. ``--keys`` project
keys are used round-robin at ``--rate`` decisions per second (one loop, open: a slow answer does
not slow the schedule) before, during and after the cut; every key is seen before it. Prints
the status counts of each phase and the usage rows written against the answers served. The
database is emptied first (it must be a scratch one). Issue #31: zero failed decisions for keys
seen within ARBITER_KEY_STALE_SECONDS.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter

import httpx
from sqlalchemy import func, select, text

from app.db import migrate
from app.db.models import Base, UsageRecord
from app.db.session import Database
from infra_adapters.emulators.ollama import OllamaState, make_ollama_app
from infra_adapters.emulators.server import EmulatorServer
from tests.reliability.proxy import TcpProxy
from tests.support import Stack, decision, start_gateway


async def phase(url: str, keys: list[str], rate: float, seconds: float) -> Counter[str]:
    counts: Counter[str] = Counter()
    body = decision()
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=httpx.Limits(max_connections=64)) as client:
        async def one(key: str) -> None:
            try:
                answer = await client.post("/v1/systemone", json=body, headers={"Authorization": f"Bearer {key}"})
                counts[str(answer.status_code)] += 1
            except httpx.HTTPError as exc:
                counts[type(exc).__name__] += 1

        start, sent, tasks = time.monotonic(), 0, []
        while (now := time.monotonic()) - start < seconds:
            due = int((now - start) * rate)
            while sent < due:
                tasks.append(asyncio.create_task(one(keys[sent % len(keys)])))
                sent += 1
            await asyncio.sleep(0.002)
        await asyncio.gather(*tasks)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--keys", type=int, default=20)
    parser.add_argument("--rate", type=float, default=100)
    parser.add_argument("--before", type=float, default=5)
    parser.add_argument("--outage", type=float, default=30)
    parser.add_argument("--after", type=float, default=10)
    parser.add_argument("--ttl", type=float, default=2)
    parser.add_argument("--stale", type=float, default=900)
    args = parser.parse_args()
    migrate.upgrade(args.database_url)
    db = Database(args.database_url)
    with db.engine.begin() as connection:
        tables = ", ".join(t.name for t in reversed(Base.metadata.sorted_tables))
        connection.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))
    with EmulatorServer(make_ollama_app(OllamaState())) as emulator:
        stack = Stack.provision(db, ollama_url=emulator.url)
        keys = [stack.project_key] + [stack.new_project(f"p{i}") for i in range(args.keys - 1)]
        url = db.engine.url
        proxy = TcpProxy(url.host or "127.0.0.1", url.port or 5432).up()
        gateway = start_gateway(url.set(port=proxy.port).render_as_string(hide_password=False),
                                key_cache_ttl=args.ttl, key_stale_seconds=args.stale, flush_interval=0.2)
        try:
            results: dict[str, object] = {}
            results["before"] = asyncio.run(phase(gateway.url, keys, args.rate, args.before))
            proxy.down()
            results["outage"] = asyncio.run(phase(gateway.url, keys, args.rate, args.outage))
            results["readyz_during"] = httpx.get(f"{gateway.url}/readyz").json()
            proxy.up()
            results["after"] = asyncio.run(phase(gateway.url, keys, args.rate, args.after))
            served = sum(int(c.get("200", 0)) for c in (results["before"], results["outage"], results["after"])
                         if isinstance(c, Counter))
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                with db.session() as session:
                    written = int(session.scalar(select(func.count()).select_from(UsageRecord)) or 0)
                if written >= served:
                    break
                time.sleep(0.2)
            results.update(served=served, usage_rows=written)
        finally:
            gateway.stop()
            proxy.stop()
    print(json.dumps({**vars(args), "database_url": "(given)", **{k: dict(v) if isinstance(v, Counter) else v
                                                                  for k, v in results.items()}}, indent=1))


if __name__ == "__main__":
    main()
