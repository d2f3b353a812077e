"""Instructions per decision: what each server executes for one System One request, counted by
valgrind's callgrind, so the figure does not move with the machine's speed or load.

    .venv/bin/python bench/instructions.py [--requests 300] [--warmup 300] [--targets direct,reference,arbiter]

bench/run.py measures time, which on a shared VM changes by the minute; this counts the user-space
instructions a server process runs while it serves ``--requests`` decisions one at a time, after
``--warmup`` untimed ones (imports, caches, the first connection). Each server runs under callgrind
with instrumentation off until the counted phase (``callgrind_control -i on``/``off``), so start-up
is quick and only the requests are counted. The same run measures the reference forwarder
(bench/reference.py: uvicorn, a plain ASGI route, aiohttp) and the emulator itself ("direct"), so
Arbiter's figure can be read against a bare forwarder. Kernel time (system calls, the loopback) is
not counted: compare with bench/run.py's CPU figures for that.
"""

from __future__ import annotations

import argparse
import http.client
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run  # bench/run.py: the cluster, the request, the CLI set-up

TARGETS = ("direct", "reference", "arbiter")
_TOTALS = re.compile(rb"^(?:summary|totals):\s+(\d+)", re.MULTILINE)


def callgrind(workdir: Path, name: str) -> list[str]:
    """The valgrind prefix for one server: no instrumentation until the counted phase."""
    return ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--dump-instr=no", "--separate-threads=yes",
            f"--callgrind-out-file={workdir / name}.callgrind.%p"]


def instructions(outputs: list[Path]) -> tuple[int, int]:
    """The instructions recorded in a process's callgrind output files (one per thread and
    dump, named ``<prefix>.<pid>[.<dump>]-<thread>``): the main thread's (the event loop), and
    the other threads' (the usage ledger's writes, the log writer)."""
    loop = other = 0
    for path in outputs:
        found = max((int(n) for n in _TOTALS.findall(path.read_bytes())), default=0)
        if path.name.endswith("-01"):
            loop += found
        else:
            other += found
    return loop, other


def wait_decision(port: int, body: bytes, headers: dict[str, str], what: str, timeout: float) -> None:
    """Until a real decision goes through (a server under valgrind starts slowly)."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            status, _ = post(http.client.HTTPConnection("127.0.0.1", port, timeout=60), body, headers)
            if status == 200:
                return
            last = f"HTTP {status}"
        except OSError as exc:
            last = repr(exc)
        time.sleep(1)
    raise RuntimeError(f"{what} not ready after {timeout:.0f}s ({last})")


def post(connection: http.client.HTTPConnection, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    connection.request("POST", "/v1/systemone", body=body, headers=headers)
    response = connection.getresponse()
    return response.status, response.read()


def drive(port: int, body: bytes, headers: dict[str, str], requests: int) -> None:
    """``requests`` decisions, one at a time on one keep-alive connection; every one must be a 200."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        for _ in range(requests):
            status, answer = post(connection, body, headers)
            if status != 200:
                raise RuntimeError(f"HTTP {status}: {answer[:300]!r}")
    finally:
        connection.close()


def control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], check=True, capture_output=True, timeout=60)


def measure(cluster: run.Cluster, target: str, requests: int, warmup: int) -> tuple[int, int]:
    """Instructions per decision of ``target``'s server process: its event loop's, its other threads'."""
    body = run.request_body(run.DIRECT_MODEL if target == "direct" else run.GATEWAY_MODEL)
    headers = {"Content-Type": "application/json"}
    prefix = callgrind(cluster.workdir, target)
    if target == "direct":
        port = run.free_port()
        process = cluster.start("direct", [*prefix, str(run.ARBITER), "emulate", "ollama", "--port", str(port)])
    elif target == "reference":
        port = cluster.reference_port
        process = cluster.start("reference", [
            *prefix, sys.executable, str(run.BENCH / "reference.py"), "--port", str(port),
            "--backend", f"http://127.0.0.1:{cluster.emulator_port}",
            "--public", run.GATEWAY_MODEL, "--backend-model", run.DIRECT_MODEL])
    else:
        port = cluster.arbiter_port
        headers["Authorization"] = f"Bearer {cluster.arbiter_key}"
        process = cluster.start("arbiter", [*prefix, str(run.ARBITER), "serve", "--host", "127.0.0.1",
                                            "--port", str(port)])
    try:
        wait_decision(port, body, headers, target, timeout=300)
        drive(port, body, headers, warmup)
        control("-i", "on", str(process.pid))
        drive(port, body, headers, requests)
        control("-i", "off", str(process.pid))
        control("-d", str(process.pid))
    finally:
        process.terminate()
        process.wait(timeout=60)
    loop, other = instructions(sorted(cluster.workdir.glob(f"{target}.callgrind.{process.pid}*")))
    return loop // requests, other // requests


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300, help="counted decisions per target")
    parser.add_argument("--warmup", type=int, default=300, help="uncounted decisions first")
    parser.add_argument("--targets", default=",".join(TARGETS), help="any of " + ", ".join(TARGETS))
    args = parser.parse_args()
    args.targets = [t for t in args.targets.split(",") if t]
    unknown = set(args.targets) - set(TARGETS)
    if unknown:
        parser.error(f"unknown targets: {', '.join(sorted(unknown))}")
    return args


def main() -> int:
    args = parse_args()
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            print(f"{tool} is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
            return 2
    workdir = Path(tempfile.mkdtemp(prefix="arbiter-instructions-"))
    cluster = run.Cluster(workdir)
    print(f"commit: {run.git_commit()}   python: {sys.version.split()[0]}   "
          f"{args.requests} counted decisions per target, one at a time, after {args.warmup}")
    figures: dict[str, tuple[int, int]] = {}
    try:
        cluster.cli("migrate")
        cluster.start("emulator", [str(run.ARBITER), "emulate", "ollama", "--port", str(cluster.emulator_port)])
        run.wait_http(cluster, f"http://127.0.0.1:{cluster.emulator_port}/api/version", "emulator")
        if "arbiter" in args.targets:
            cluster.cli("service", "add", "--type", "ollama-external", "--name", "emulated-ollama",
                        "--url", f"http://127.0.0.1:{cluster.emulator_port}")
            cluster.cli("project", "create", run.PROJECT, "--models", "all")
            cluster.arbiter_key = cluster.cli("key", "create", "--project", run.PROJECT).strip().splitlines()[-1]
        print(f"{'target':<10} {'event loop':>12} {'other threads':>14}   (k instructions per decision)")
        for target in args.targets:
            loop, other = figures[target] = measure(cluster, target, args.requests, args.warmup)
            print(f"{target:<10} {loop / 1000:12.1f} {other / 1000:14.1f}", flush=True)
    finally:
        cluster.close()
        shutil.rmtree(workdir, ignore_errors=True)
    if "reference" in figures and "arbiter" in figures:
        print(f"arbiter / reference, event loop: {figures['arbiter'][0] / figures['reference'][0]:.2f}x")
    print("Other threads do periodic work (the usage ledger's batched writes, the log writer): under\n"
          "valgrind a request takes ~20 times longer, so their share per decision is overstated here.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
