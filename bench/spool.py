"""The usage spool under SIGKILL, and what ARBITER_USAGE_DURABLE=always costs a decision.

    .venv/bin/python bench/spool.py [--requests 2000] [--seconds 4] [--rounds 3]

A throw-away deployment in a temp dir (SQLite, the Ollama emulator, one `arbiter serve`). For
each mode (no spool directory: records in memory only; ARBITER_USAGE_SPOOL_DIR with the default
fsync interval of 0.1 s; and ARBITER_USAGE_DURABLE=always):

- **latency**: ``--requests`` decisions one at a time, mean / p50 / p99 of each (the per-request
  cost of ``always`` is its mean minus the interval mode's);
- **SIGKILL under load**: 8 clients send decisions for ``--seconds``, the server gets SIGKILL while
  they do, a new server starts (loading the spool) and is stopped with SIGTERM; the answered
  requests (200) missing from the ledger are counted, ``--rounds`` times.

ARBITER_FLUSH_INTERVAL is the default (1 s): the batched write to the database runs as usual.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ARBITER = Path(sys.executable).parent / "arbiter"
BODY = json.dumps({"model": "nimble", "state": "s", "questions": {"q": {"type": "noul"}}}).encode()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(port: int, path: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"process exited with {process.returncode}")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            connection.request("GET", path)
            if connection.getresponse().status < 500:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"port {port} not ready")


class Deployment:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.database = root / "arbiter.db"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("ARBITER_")}
        self.env.update(ARBITER_DATABASE_URL=f"sqlite:///{self.database}", ARBITER_LOG_LEVEL="WARNING")
        self.port = free_port()
        emulator_port = free_port()
        self.emulator = subprocess.Popen([ARBITER, "emulate", "ollama", "--port", str(emulator_port)],
                                         env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_ready(emulator_port, "/api/version", self.emulator)
        self.cli("migrate")
        self.cli("service", "add", "--type", "ollama-external", "--url", f"http://127.0.0.1:{emulator_port}")
        self.cli("project", "create", "bench")
        self.key = self.cli("key", "create", "--project", "bench").strip().splitlines()[-1]

    def cli(self, *args: str) -> str:
        return subprocess.run([ARBITER, *args], env=self.env, check=True, capture_output=True, text=True).stdout

    def serve(self, mode: str) -> subprocess.Popen[bytes]:
        env = dict(self.env)
        if mode != "memory":
            env["ARBITER_USAGE_SPOOL_DIR"] = str(self.root / "spool")
        if mode == "always":
            env["ARBITER_USAGE_DURABLE"] = "always"
        server = subprocess.Popen([ARBITER, "serve", "--port", str(self.port)], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_ready(self.port, "/healthz", server)
        return server

    def rows(self) -> int:
        with sqlite3.connect(self.database) as connection:
            return int(connection.execute("select count(*) from usage_ledger").fetchone()[0])

    def connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)

    def decide(self, connection: http.client.HTTPConnection) -> int:
        connection.request("POST", "/v1/systemone", BODY, {"Authorization": f"Bearer {self.key}",
                                                            "Content-Type": "application/json"})
        response = connection.getresponse()
        response.read()
        return response.status


def latency(deployment: Deployment, mode: str, requests: int) -> dict[str, float]:
    server = deployment.serve(mode)
    try:
        connection = deployment.connection()
        for _ in range(200):  # warm-up
            deployment.decide(connection)
        times = []
        for _ in range(requests):
            started = time.perf_counter()
            assert deployment.decide(connection) == 200
            times.append(time.perf_counter() - started)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    times.sort()
    return {"mean_ms": statistics.fmean(times) * 1000, "p50_ms": times[len(times) // 2] * 1000,
            "p99_ms": times[int(len(times) * 0.99)] * 1000}


def killed(deployment: Deployment, mode: str, seconds: float) -> dict[str, int]:
    before = deployment.rows()
    server = deployment.serve(mode)
    answered = [0]
    stop = threading.Event()
    lock = threading.Lock()

    def client() -> None:
        connection = deployment.connection()
        while not stop.is_set():
            try:
                status = deployment.decide(connection)
            except OSError:
                return  # the server is gone: this request got no answer
            if status == 200:
                with lock:
                    answered[0] += 1

    threads = [threading.Thread(target=client) for _ in range(8)]
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    server.send_signal(signal.SIGKILL)
    server.wait(timeout=30)
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    again = deployment.serve(mode)  # loads the spool
    again.send_signal(signal.SIGTERM)
    again.wait(timeout=60)
    written = deployment.rows() - before
    return {"answered": answered[0], "written": written, "missing": max(0, answered[0] - written)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="arbiter-bench-spool-"))
    deployment = Deployment(root)
    results: dict[str, Any] = {}
    try:
        for mode in ("memory", "interval", "always"):
            figures = latency(deployment, mode, args.requests)
            kills = [killed(deployment, mode, args.seconds) for _ in range(args.rounds)]
            results[mode] = {"latency": figures, "kills": kills}
            print(f"{mode:>8}: mean {figures['mean_ms']:.3f} ms  p50 {figures['p50_ms']:.3f} ms  "
                  f"p99 {figures['p99_ms']:.3f} ms | SIGKILL: " + ", ".join(
                      f"{k['missing']} of {k['answered']} answered missing" for k in kills), flush=True)
        cost = results["always"]["latency"]["mean_ms"] - results["interval"]["latency"]["mean_ms"]
        print(f"always costs {cost * 1000:.0f} µs per decision (mean, concurrency 1) over interval")
        spool = root / "spool"
        print(f"left in the spool after the last start: {sorted(p.name for p in spool.iterdir())}")
    finally:
        deployment.emulator.terminate()
        deployment.emulator.wait(timeout=30)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
