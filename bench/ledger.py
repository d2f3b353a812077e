"""The usage ledger at deployment scale (issue #31): usage reads over millions of rows, and a storm
of them while decisions run.

    python bench/ledger.py [--rows 1000000] [--days 90] [--rounds 20] [--database postgresql://...]

It fills a fresh PostgreSQL database (``--database`` names the server; a database of its own is
made and dropped) with ``--rows`` usage records spread over ``--days`` days, for five projects (one
of them dormant: a few rows, all old), three keys each and four models, by COPY; builds the
rollups a day at a time (what migration 0017 does) and merges the days before yesterday into the
day level (what the usage maintenance does), then starts ``arbiter serve`` and the Ollama
emulator and prints:

- the seconds to fill, to build the rollups and to merge their days (and a merge run with nothing
  to do), and the bytes per usage row (``usage_ledger``, every day partition with its indexes; then
  the rollups' bytes per usage row, and their rows by the hour and by the day);
- retention of one day: the milliseconds to drop the oldest day's partition of the filled table
  (app/telemetry/retention.py's step), and its rows;
- the p50 and p95 of every usage read, over HTTP: the web UI's usage pages (24 hours, 30 and 90
  days), usage per key, the totals CSV of 90 days, /admin/usage (all time, first page),
  /admin/projects/{p}/usage, /v1/usage?days=90, the latest requests of the dormant project, and
  the requests CSV of one busy project over 7 days (every row; its rows per second);
- a report storm: 12 concurrent 90-day usage reads, three times over, while decisions go at
  ~100 a second with another project's key: decisions answered and failed.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx
import psycopg

PROJECTS = ("alpha", "beta", "gamma", "delta", "dormant")
MODELS = ("nimble", "tev1", "llama3.2", "qwen3:0.6b")
ADMIN_KEY = "arb_admin_" + "benchledgerkey0123456789abcdefXYZ"
BODY = {"model": "nimble", "state": {"ticket": "My card was charged twice."},
        "questions": {"team": {"type": "choice", "instructions": "Which team?",
                               "criteria": {"billing": "payments and refunds", "shipping": None}}}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--days", type=int, default=90)
    parser.add_argument("--rounds", type=int, default=20, help="timed reads of each usage read")
    parser.add_argument("--database", default="postgresql://postgres@127.0.0.1:5432/postgres",
                        help="a PostgreSQL server (any database on it): the bench makes one of its own there")
    parser.add_argument("--keep", action="store_true", help="leave the database behind")
    parser.add_argument("--no-reads", action="store_true",
                        help="fill, size and retention only: no server, no usage reads, no storm")
    return parser.parse_args()


def fill(url: str, rows: int, days: int, ids: dict[str, int], keys: dict[str, list[int]]) -> float:
    """COPY ``rows`` records over the last ``days`` days; answers the seconds it took."""
    draw = random.Random(31)
    now = dt.datetime.now(dt.UTC)
    started = time.monotonic()
    busy = [p for p in PROJECTS if p != "dormant"]
    with psycopg.connect(url) as connection, connection.cursor() as cursor:
        with cursor.copy("COPY usage_ledger (at, request_id, project_id, key_id, operation, model, provider, status, "
                         "input_tokens, output_tokens, latency_ms, record_uid, alias) FROM STDIN") as copy:
            for i in range(rows):
                project = "dormant" if i % 100_000 == 0 else busy[i % 4 if i % 10 else 0]  # alpha: the busiest
                at = (now - dt.timedelta(days=days - 1, hours=20) if project == "dormant"
                      else now - dt.timedelta(seconds=draw.random() * days * 86400))
                status = 200 if draw.random() < 0.95 else draw.choice((400, 429, 502, 504))
                copy.write_row((at, f"{i:016x}", ids[project], draw.choice(keys[project]),
                                "decision" if i % 7 else "chat", MODELS[i % 4], "ollama", status,
                                draw.randint(50, 900), draw.randint(1, 40), round(draw.lognormvariate(3, 0.8), 3),
                                f"{i:032x}", "fast" if i % 13 == 0 else None))
        connection.commit()
        cursor.execute("ANALYZE usage_ledger")
        connection.commit()
    return time.monotonic() - started


def sizes(url: str) -> dict[str, int]:
    with psycopg.connect(url) as connection:
        found = {}
        for table in ("usage_ledger", "usage_rollups", "usage_latency_rollups"):
            # A partitioned table's own size is 0: the sum over its partitions (and their indexes).
            found[table] = int(connection.execute(
                f"SELECT COALESCE((SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree('{table}')), "
                f"pg_total_relation_size('{table}'))").fetchone()[0])
            found[f"{table}.rows"] = int(connection.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
        return found


def partitions(url: str, days: int) -> int:
    """A day partition for every day the fill spans (the maintenance's step 1 made them as the days came)."""
    from app.db.session import Database
    from app.telemetry import retention

    database = Database(url)
    today = dt.datetime.now(dt.UTC).date()
    for back in range(days + 1):
        retention.ensure_partitions(database.engine, today - dt.timedelta(days=back), retention.Outcome())
    total = len(retention.day_partitions(database.engine))
    database.dispose()
    return total


def retain(url: str, days: int) -> None:
    """Retention of one day: the oldest day's partition dropped (retention.drop_old_partitions)."""
    from app.db.session import Database
    from app.telemetry import retention

    database = Database(url)
    with psycopg.connect(url) as connection:  # the first whole day of the fill (its first is a part of one)
        first = connection.execute("SELECT min(at) FROM usage_ledger").fetchone()[0].astimezone(dt.UTC).date()
        oldest = first + dt.timedelta(days=1)
        name = retention.day_partitions(database.engine)[oldest]
        rows = int(connection.execute(f"SELECT count(*) FROM {name}").fetchone()[0])
    # The days before it first (not timed): the step below drops that one day.
    retention.drop_old_partitions(database.engine, dt.datetime.combine(oldest, dt.time(), dt.UTC),
                                  retention.Outcome())
    cutoff = dt.datetime.combine(oldest + dt.timedelta(days=1), dt.time(), dt.UTC)
    outcome = retention.Outcome()
    started = time.perf_counter()
    retention.drop_old_partitions(database.engine, cutoff, outcome)
    took = (time.perf_counter() - started) * 1000
    database.dispose()
    print(f"retention of one day: {name} ({rows:,} rows) dropped in {took:.1f} ms "
          f"({', '.join(outcome.dropped)})")


def build_rollups(url: str) -> float:
    from app.db import rollups
    from app.db.session import Database

    database = Database(url)
    started = time.monotonic()
    with psycopg.connect(url) as connection:
        first, last = connection.execute("SELECT min(at), max(at) FROM usage_ledger").fetchone()
    for start, end in rollups.days(first.astimezone(dt.UTC).date(), last.astimezone(dt.UTC).date()):
        with database.engine.begin() as connection:
            rollups.rebuild(connection, start, end)
    database.dispose()
    return time.monotonic() - started


def merge_days(url: str) -> tuple[float, float, int]:
    """The maintenance's day level: seconds to merge every day before yesterday, seconds of a run
    with nothing left to merge, and the days merged."""
    from app.db import rollups
    from app.db.session import Database
    from app.telemetry import retention

    database = Database(url)
    before = rollups.by_the_hour_from(dt.datetime.now(dt.UTC).date())
    outcome = retention.Outcome()
    started = time.monotonic()
    while True:
        retention.merge_old_days(database.engine, before, outcome)
        if not outcome.more:
            break
        outcome.more = False
    merged = time.monotonic() - started
    started = time.monotonic()
    retention.merge_old_days(database.engine, before, retention.Outcome())
    idle = time.monotonic() - started
    database.dispose()
    return merged, idle, outcome.days_merged


def provision(url: str) -> tuple[dict[str, int], dict[str, list[int]], dict[str, str]]:
    from app.db.session import Database
    from app.tenancy import service as tenancy
    from app.tenancy.keys import KeyHasher
    from app.tenancy.service import CLI

    database = Database(url)
    ids: dict[str, int] = {}
    keys: dict[str, list[int]] = {}
    secrets: dict[str, str] = {}
    with database.session() as s:
        for project in (*PROJECTS, "deciding"):
            ids[project] = tenancy.create_project(s, project, CLI, models="all").id
            keys[project] = []
            for n in range(3):
                key, secret = tenancy.create_key(s, KeyHasher(), CLI, kind="project", project=project, name=f"k{n}")
                keys[project].append(key.id)
                secrets.setdefault(project, secret)
    database.dispose()
    return ids, keys, secrets


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q * len(ordered)) - 1))]


def timed(client: httpx.Client, path: str, rounds: int, **params: Any) -> tuple[float, float, int]:
    """p50 and p95 (ms) of ``rounds`` GETs of ``path``, and the size of its answer."""
    took, size = [], 0
    for _ in range(rounds):
        started = time.perf_counter()
        answer = client.get(path, params=params)
        took.append((time.perf_counter() - started) * 1000)
        if answer.status_code != 200:
            raise RuntimeError(f"{path} {params}: {answer.status_code} {answer.text[:300]}")
        size = len(answer.content)
    return statistics.median(took), percentile(took, 0.95), size


def sign_in(client: httpx.Client) -> None:
    form = client.get("/ui/sign-in")
    csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
    if csrf is None:
        raise RuntimeError("no sign-in form")
    answer = client.post("/ui/sign-in", data={"csrf": csrf.group(1), "key": ADMIN_KEY})
    if answer.status_code >= 400:
        raise RuntimeError(f"sign-in refused: {answer.status_code}")


async def storm(base: str, reader_key: str, decider_key: str, seconds: float) -> dict[str, int]:
    """12 concurrent 90-day usage reads, again and again, while decisions go at ~100 a second."""
    counts = {"decisions": 0, "decision_errors": 0, "reads": 0, "reads_refused": 0}
    stop = time.monotonic() + seconds
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        async def reader() -> None:
            while time.monotonic() < stop:
                answer = await client.get("/v1/usage", params={"days": 90},
                                          headers={"Authorization": f"Bearer {reader_key}"})
                counts["reads" if answer.status_code == 200 else "reads_refused"] += 1

        async def decider() -> None:
            pending: set[asyncio.Task[Any]] = set()

            async def one() -> None:
                try:
                    answer = await client.post("/v1/systemone", json=BODY,
                                               headers={"Authorization": f"Bearer {decider_key}"})
                    ok = answer.status_code == 200
                except httpx.HTTPError:
                    ok = False
                counts["decisions"] += 1
                counts["decision_errors"] += 0 if ok else 1
            while time.monotonic() < stop:
                task = asyncio.create_task(one())
                pending.add(task)
                task.add_done_callback(pending.discard)
                await asyncio.sleep(0.01)
            await asyncio.gather(*pending)
        await asyncio.gather(decider(), *(reader() for _ in range(12)))
    return counts


def main() -> int:
    args = parse_args()
    server = psycopg.conninfo.conninfo_to_dict(args.database)
    name = f"arbiter_bench_ledger_{os.getpid()}"
    admin_url = args.database
    with psycopg.connect(admin_url, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    url = psycopg.conninfo.make_conninfo(args.database, dbname=name)
    sqlalchemy_url = f"postgresql://{server.get('user', 'postgres')}@{server.get('host', '127.0.0.1')}:" \
                     f"{server.get('port', 5432)}/{name}"
    procs: list[subprocess.Popen[bytes]] = []
    workdir = Path(tempfile.mkdtemp(prefix="arbiter-bench-ledger-"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ARBITER_DATABASE_URL": sqlalchemy_url,
           "ARBITER_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY, "ARBITER_LOG_LEVEL": "WARNING",
           "ARBITER_SECRET_KEY": "bench-ledger-secret-key-0123456789abcdef",
           "ARBITER_USAGE_READS_PER_MINUTE": "0", "ARBITER_USAGE_SPOOL_DIR": str(workdir)}
    try:
        from app.db import migrate
        migrate.upgrade(sqlalchemy_url)
        ids, keys, secrets = provision(sqlalchemy_url)
        made = partitions(sqlalchemy_url, args.days)
        print(f"{made} day partitions (every day of the fill, as the maintenance makes them)")
        seconds = fill(url, args.rows, args.days, ids, keys)
        print(f"filled {args.rows:,} usage rows over {args.days} days in {seconds:.1f} s "
              f"({args.rows / seconds:,.0f} rows/s, COPY)")
        seconds = build_rollups(sqlalchemy_url)
        print(f"rollups built a day at a time (migration 0017's work) in {seconds:.1f} s "
              f"({seconds / args.rows * 1e6:.1f} s per million rows)")
        hourly = sizes(url)
        seconds, idle, merged = merge_days(sqlalchemy_url)
        print(f"{merged} days of rollups merged into the day level (the maintenance's work) in {seconds:.1f} s; "
              f"a run with nothing to merge {idle * 1000:.0f} ms")
        found = sizes(url)
        print(f"rollup rows by the hour {hourly['usage_rollups.rows']:,} + {hourly['usage_latency_rollups.rows']:,}, "
              f"by the day (the last two days by the hour) {found['usage_rollups.rows']:,} + "
              f"{found['usage_latency_rollups.rows']:,}")
        per_row = found["usage_ledger"] / args.rows
        rolled = (found["usage_rollups"] + found["usage_latency_rollups"]) / args.rows
        print(f"bytes per usage row: {per_row:.0f} (usage_ledger, its partitions with their indexes); "
              f"rollups add {rolled:.1f} ({found['usage_rollups.rows']:,} + "
              f"{found['usage_latency_rollups.rows']:,} rollup rows)")
        retain(sqlalchemy_url, args.days)
        if args.no_reads:
            return 0

        emulator, port = free_port(), free_port()
        for argv in ([sys.executable, "-m", "app.cli", "emulate", "ollama", "--port", str(emulator)],
                     [sys.executable, "-m", "app.cli", "serve", "--port", str(port)]):
            procs.append(subprocess.Popen(argv, env=env, cwd=ROOT, stdout=(workdir / "log").open("ab"),
                                          stderr=subprocess.STDOUT, start_new_session=True))
            time.sleep(1.5)
        base = f"http://127.0.0.1:{port}"
        admin = httpx.Client(base_url=base, timeout=120, headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        for _ in range(120):
            try:
                if admin.get("/readyz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        added = admin.post("/admin/services", json={"type": "ollama-external", "name": "emu",
                                                    "url": f"http://127.0.0.1:{emulator}"})
        if added.status_code >= 300:
            raise RuntimeError(f"adding the emulator: {added.status_code} {added.text[:200]}")
        ui = httpx.Client(base_url=base, timeout=120)
        sign_in(ui)
        project = httpx.Client(base_url=base, timeout=120, headers={"Authorization": f"Bearer {secrets['alpha']}"})
        reads = [
            ("/ui/usage 24 hours", ui, "/ui/usage", {"days": 1}),
            ("/ui/usage 30 days", ui, "/ui/usage", {"days": 30}),
            ("/ui/usage 90 days", ui, "/ui/usage", {"days": 90}),
            ("/ui/usage 90 days, one project", ui, "/ui/usage", {"days": 90, "project": "alpha"}),
            ("/ui/usage/keys 90 days", ui, "/ui/usage/keys", {"days": 90, "project": "alpha"}),
            ("/ui/usage/totals.csv 90 days", ui, "/ui/usage/totals.csv", {"days": 90}),
            ("/ui/usage/requests 7 days", ui, "/ui/usage/requests", {"days": 7, "project": "beta"}),
            ("/admin/usage all time (first page)", admin, "/admin/usage", {}),
            ("/admin/projects/alpha/usage", admin, "/admin/projects/alpha/usage", {}),
            ("/admin/usage/recent dormant project", admin, "/admin/usage/recent", {"project": "dormant"}),
            ("/v1/usage?days=90", project, "/v1/usage", {"days": 90}),
        ]
        print(f"\n{'usage read':<40} {'p50 ms':>9} {'p95 ms':>9} {'bytes':>10}   ({args.rounds} rounds each)")
        for label, client, path, params in reads:
            p50, p95, size = timed(client, path, args.rounds, **params)
            print(f"{label:<40} {p50:>9.1f} {p95:>9.1f} {size:>10,}")
        started = time.perf_counter()
        lines = 0
        with ui.stream("GET", "/ui/usage/requests.csv", params={"days": 7, "project": "alpha"}) as answer:
            for chunk in answer.iter_bytes():
                lines += chunk.count(b"\n")
        took = time.perf_counter() - started
        print(f"{'/ui/usage/requests.csv 7 days, alpha':<40} {took * 1000:>9.0f} ms for {lines - 1:,} rows "
              f"({(lines - 1) / took:,.0f} rows/s)")

        counts = asyncio.run(storm(base, secrets["alpha"], secrets["deciding"], 20.0))
        print(f"\nreport storm (12 concurrent /v1/usage?days=90 for 20 s, decisions at ~100/s with another "
              f"project's key): {counts['decisions']} decisions, {counts['decision_errors']} failed; "
              f"{counts['reads']} reads answered, {counts['reads_refused']} told to come back (503)")
        return 0
    finally:
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(proc.pid, signal.SIGKILL)
        if not args.keep:
            with psycopg.connect(admin_url, autocommit=True) as connection:
                connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    sys.exit(main())
