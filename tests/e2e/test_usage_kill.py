"""A running `arbiter serve` killed with SIGKILL (an OOM kill) while it serves: its usage records
are in the spool's journal, and the next start writes them. With ARBITER_USAGE_DURABLE=always
none is lost; by default at most those of the last fsync interval (0.1 s)."""

from __future__ import annotations

import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from sqlalchemy import create_engine, func, select

from app.db.models import UsageRecord
from tests.e2e.conftest import ARBITER, environment, run, shop, wait_ready
from tests.support import free_port, wait_for

N = 150
LAST = 5  # sent just before the kill: those are the ones the default may lose


def spooled(spool: Path) -> int:
    return sum(path.read_bytes().count(b"\n") for path in spool.glob("arbiter-usage-spool-*.journal"))


def test_a_killed_process_loses_at_most_its_last_fsync_window(tmp_path: Path) -> None:
    database = f"sqlite:///{tmp_path / 'arbiter.db'}"
    spool = tmp_path / "spool"
    # Only the journal keeps the records: the batched write to the database never comes in time.
    env = {**environment(database), "ARBITER_FLUSH_INTERVAL": "3600", "ARBITER_USAGE_SPOOL_DIR": str(spool)}
    run(["migrate"], env)
    port = free_port()
    emulator, key = shop(env)
    processes = [emulator]
    try:
        body = {"model": "nimble", "state": "s", "questions": {"q": {"type": "noul"}}}

        def serve(extra: dict[str, str]) -> subprocess.Popen[bytes]:
            server = subprocess.Popen([ARBITER, "serve", "--port", str(port)], env={**env, **extra},
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            processes.append(server)
            wait_ready(f"http://127.0.0.1:{port}/healthz", server)
            return server

        def send(count: int) -> None:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {key}"},
                              timeout=30) as client, ThreadPoolExecutor(8) as pool:
                codes = list(pool.map(lambda _: client.post("/v1/systemone", json=body).status_code, range(count)))
            assert codes == [200] * count

        def count_after_restart() -> tuple[int, int]:
            server = serve({"ARBITER_FLUSH_INTERVAL": "1"})  # loads what the killed one left
            server.send_signal(signal.SIGTERM)
            assert server.wait(timeout=60) == 0
            engine = create_engine(database)
            with engine.connect() as connection:
                total = connection.scalar(select(func.count()).select_from(UsageRecord)) or 0
                distinct = connection.scalar(select(func.count(func.distinct(UsageRecord.request_id)))) or 0
            engine.dispose()
            return total, distinct

        # The default: the journal is fsynced every 0.1 s.
        server = serve({})
        send(N)
        wait_for(lambda: spooled(spool) >= N)  # on disk: what came before the last interval
        send(LAST)
        server.send_signal(signal.SIGKILL)
        server.wait(timeout=30)
        total, distinct = count_after_restart()
        assert N <= total <= N + LAST and total == distinct  # never written twice

        # ARBITER_USAGE_DURABLE=always: every answered request is on disk before its answer.
        server = serve({"ARBITER_USAGE_DURABLE": "always"})
        send(N)
        server.send_signal(signal.SIGKILL)
        server.wait(timeout=30)
        assert count_after_restart() == (total + N, distinct + N)
        assert [p.name for p in spool.iterdir()] == []
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
