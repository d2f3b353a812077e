"""N requests to a running `arbiter serve`, SIGTERM, start again: exactly N usage records."""

from __future__ import annotations

import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from sqlalchemy import create_engine, func, select

from app.db.models import UsageRecord
from tests.e2e.conftest import ARBITER, environment, run, shop, wait_ready
from tests.support import free_port

N = 120


def test_no_usage_record_is_lost_across_a_restart(tmp_path: Path) -> None:
    database = f"sqlite:///{tmp_path / 'arbiter.db'}"
    env = {**environment(database), "ARBITER_FLUSH_INTERVAL": "3600"}  # only the shutdown flush writes
    run(["migrate"], env)
    port = free_port()
    emulator, key = shop(env)
    processes = [emulator]
    try:
        body = {"model": "nimble", "state": "s", "questions": {"q": {"type": "noul"}}}
        for round_ in range(2):
            server = subprocess.Popen([ARBITER, "serve", "--port", str(port)], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            processes.append(server)
            wait_ready(f"http://127.0.0.1:{port}/healthz", server)
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {key}"},
                              timeout=30) as client, ThreadPoolExecutor(8) as pool:
                codes = list(pool.map(lambda _: client.post("/v1/systemone", json=body).status_code, range(N)))
            assert codes == [200] * N
            server.send_signal(signal.SIGTERM)
            assert server.wait(timeout=30) == 0
            engine = create_engine(database)
            with engine.connect() as connection:
                assert connection.scalar(select(func.count()).select_from(UsageRecord)) == N * (round_ + 1)
            engine.dispose()
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
