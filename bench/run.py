"""Benchmark Arbiter's decision hot path against the Ollama emulator it fronts.

    .venv/bin/python bench/run.py [--quick] [--requests N] [--concurrency 1,32]

Sets up a throw-away deployment in a temp dir (SQLite, the Ollama emulator and
one `arbiter serve` process with one worker, each on a free loopback port),
provisions a service, a project and a key through the CLI, then, for each
concurrency, runs the load generator (bench/load.py, its own process) twice:
straight at the emulator (the floor) and through Arbiter. Prints a table and
writes bench/results/latest.json. See bench/README.md for how to read it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
VENV_BIN = Path(sys.executable).parent
ARBITER = VENV_BIN / "arbiter"
RESULTS = BENCH / "results"

CLK_TCK = os.sysconf("SC_CLK_TCK")
DIRECT_MODEL = "nimble:latest"  # the emulator's own name for the model
GATEWAY_MODEL = "nimble"  # its public name on Arbiter
PROJECT = "bench"

# A realistic decision request: a ~1 KB support ticket and three typed questions.
TICKET_MESSAGE = (
    "Hello, I am writing for the third time about our March invoice (INV-2024-03-5581). "
    "Our company card was charged twice on 1 March, once for EUR 1,249.00 and again for the "
    "same amount about four minutes later, and both charges are now settled on our "
    "statement. Your chat agent told me on 6 March that the duplicate would be refunded "
    "within five business days, but nothing has arrived and the ticket was closed without "
    "a reply. We are a team of 40 on the Business plan and our finance department closes "
    "the quarter on Friday, so I need either the refund or a written confirmation with a "
    "date by Thursday at the latest. If this cannot be resolved we will have to dispute the "
    "charge with our bank and review whether we renew in June. Please call me back."
)
STATE: dict[str, Any] = {
    "ticket_id": "TCK-2024-118734",
    "channel": "email",
    "created_at": "2024-04-02T08:41:17Z",
    "customer": {"id": "cus_8f2a91c4", "plan": "business", "seats": 40,
                 "customer_since": "2021-03-14", "country": "DE"},
    "subject": "Charged twice for the March invoice, still no refund",
    "previous_tickets": 3,
    "message": TICKET_MESSAGE,
}
QUESTIONS: dict[str, Any] = {
    "team": {"type": "choice", "instructions": "Which team should handle this ticket?",
             "criteria": {"billing": "invoices, charges, refunds and payment methods",
                          "technical": "bugs, outages, integrations and the API",
                          "account": "logins, seats, plan changes and cancellations",
                          "sales": None}},
    "urgent": {"type": "noul", "instructions": "Does this need a reply within the hour?",
               "criteria": {"true": "money, a deadline or a churn threat is involved",
                            "false": "it can wait for the normal queue"}},
    "tone": {"type": "score", "instructions": "How upset is the customer?",
             "criteria": ["calm", "annoyed", "furious"]},
}


def request_body(model: str) -> bytes:
    return json.dumps({"model": model, "state": STATE, "questions": QUESTIONS},
                      separators=(",", ":"), ensure_ascii=False).encode()


# -- processes ------------------------------------------------------------------------

class Cluster:
    """The emulator, Arbiter and whichever load generator is running; stopped in `close`."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.env = dict(os.environ,
                        ARBITER_DATABASE_URL=f"sqlite:///{workdir / 'arbiter.db'}",
                        ARBITER_LOG_LEVEL="WARNING",
                        PYTHONUNBUFFERED="1")
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.emulator_port = free_port()
        self.arbiter_port = free_port()

    def cli(self, *args: str) -> str:
        done = subprocess.run([str(ARBITER), *args], check=False, env=self.env,
                              cwd=self.workdir, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"arbiter {' '.join(args)} failed ({done.returncode}):\n"
                               f"{done.stdout}{done.stderr}")
        return done.stdout

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the dir
        # A session of its own: a Ctrl-C reaches only us, and `close` stops the servers
        # in order (Arbiter first, so it can flush its batched writes).
        proc = subprocess.Popen([str(ARBITER), *args], env=self.env, cwd=self.workdir,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = proc
        return proc

    def log_tail(self, name: str, lines: int = 20) -> str:
        path = self.workdir / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}")

    def close(self) -> None:
        for name in ("loadgen", "arbiter", "emulator"):
            proc = self.procs.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGINT if name == "loadgen" else signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_http(cluster: Cluster, url: str, what: str, timeout: float = 30.0,
              data: bytes | None = None, headers: dict[str, str] | None = None) -> None:
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        cluster.check_alive()
        request = urllib.request.Request(url, data=data, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=2) as response:
                if response.status == 200:
                    return
                last = f"HTTP {response.status}"
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}: {exc.read()[:200]!r}"
        except OSError as exc:
            last = repr(exc)
        time.sleep(0.1)
    raise RuntimeError(f"{what} not ready after {timeout:.0f}s ({last})")


def rss_mb(pid: int) -> float:
    """Resident memory of a process in MiB, from /proc."""
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def cpu_ticks(pid: int) -> int:
    """utime + stime of a process (all its threads), in clock ticks, from /proc."""
    with open(f"/proc/{pid}/stat", "rb") as handle:
        raw = handle.read()
    fields = raw[raw.rindex(b")") + 2:].split()  # fields[0] is field 3 (state)
    return int(fields[11]) + int(fields[12])  # fields 14 (utime) and 15 (stime)


# -- one cell -------------------------------------------------------------------------

def run_cell(cluster: Cluster, target: str, concurrency: int, requests: int,
             warmup: int, key: str) -> dict[str, Any]:
    if target == "direct":
        url = f"http://127.0.0.1:{cluster.emulator_port}/v1/systemone"
        body, headers = request_body(DIRECT_MODEL), []
    else:
        url = f"http://127.0.0.1:{cluster.arbiter_port}/v1/systemone"
        body, headers = request_body(GATEWAY_MODEL), ["--header", f"Authorization: Bearer {key}"]
    body_file = cluster.workdir / f"body-{target}.json"
    body_file.write_bytes(body)

    cmd = [sys.executable, str(BENCH / "load.py"), "--url", url, "--body-file", str(body_file),
           "--requests", str(requests), "--concurrency", str(concurrency),
           "--warmup", str(warmup), "--handshake", *headers]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT)
    cluster.procs["loadgen"] = proc
    assert proc.stdin is not None and proc.stdout is not None
    try:
        line = proc.stdout.readline()
        event = json.loads(line) if line.strip() else {}
        if event.get("event") != "warm":
            rest = proc.stdout.read()
            proc.wait()
            raise RuntimeError(f"load generator failed in warm-up: {(line + rest).decode()}")
        servers = {name: p.pid for name, p in cluster.procs.items() if name != "loadgen"}
        before = {name: cpu_ticks(pid) for name, pid in servers.items()}
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        after = {name: cpu_ticks(pid) for name, pid in servers.items()}
        rss = {name: rss_mb(pid) for name, pid in servers.items()}
        proc.wait(timeout=30)
    finally:
        cluster.procs.pop("loadgen", None)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if not line.strip():
        raise RuntimeError(f"load generator exited with {proc.returncode} and no result")
    result = json.loads(line)
    if "fatal" in result:
        raise RuntimeError(f"load generator: {result}")
    result["target"] = target
    result["server_cpu_s"] = {name: (after[name] - before[name]) / CLK_TCK for name in servers}
    result["server_cpu_ms_per_request"] = {
        name: seconds * 1000.0 / requests for name, seconds in result["server_cpu_s"].items()
    }
    result["server_rss_mb_after"] = rss
    cluster.check_alive()
    return result


# -- output ---------------------------------------------------------------------------

COLUMNS = [
    ("target", "<"), ("conc", ">"), ("requests", ">"), ("errors", ">"), ("req/s", ">"),
    ("p50 ms", ">"), ("p99 ms", ">"), ("+p50 ms", ">"), ("+p99 ms", ">"),
    ("emu CPU ms/req", ">"), ("arb CPU ms/req", ">"), ("loadgen CPU ms/req", ">"),
    ("loadgen util", ">"),
]


def table_rows(cells: list[dict[str, Any]]) -> list[list[str]]:
    direct = {c["concurrency"]: c for c in cells if c["target"] == "direct"}
    rows = []
    for c in cells:
        lat = c["latency_ms"]
        floor = direct.get(c["concurrency"]) if c["target"] == "arbiter" else None
        added = [f"{lat[q] - floor['latency_ms'][q]:.3f}" if floor else "-" for q in ("p50", "p99")]
        cpu = c["server_cpu_ms_per_request"]
        rows.append([
            c["target"], str(c["concurrency"]), str(c["requests"]), str(c["errors"]),
            f"{c['throughput_rps']:.0f}", f"{lat['p50']:.3f}", f"{lat['p99']:.3f}",
            *added,
            f"{cpu['emulator']:.3f}", f"{cpu['arbiter']:.3f}",
            f"{c['loadgen_cpu_ms_per_request']:.3f}",
            f"{c['loadgen_cpu_utilization'] * 100:.0f}%",
        ])
    return rows


def format_table(cells: list[dict[str, Any]]) -> str:
    rows = table_rows(cells)
    widths = [max(len(name), *(len(r[i]) for r in rows)) for i, (name, _) in enumerate(COLUMNS)]

    def line(values: list[str]) -> str:
        return "  ".join(f"{v:{align}{w}}" for v, (_, align), w in zip(values, COLUMNS, widths))

    out = [line([name for name, _ in COLUMNS]), line(["-" * w for w in widths])]
    out += [line(r) for r in rows]
    return "\n".join(out)


def git_commit() -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], check=False, cwd=ROOT,
                              capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "app", "infra_adapters"],
                               check=False, cwd=ROOT, capture_output=True, text=True, timeout=10)
    except OSError:
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


# -- main -----------------------------------------------------------------------------

def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="a short smoke run (300 requests per cell, short warm-up)")
    parser.add_argument("--requests", type=int, default=None,
                        help="timed requests per cell (default: 3,000 at concurrency 1, "
                             "10,000 above; 300 with --quick)")
    parser.add_argument("--concurrency", default="1,32",
                        help="comma-separated concurrencies (default: 1,32)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="untimed requests before each cell (default 500; 100 with --quick)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the temp dir (database, server logs) and print its path")
    args = parser.parse_args()
    try:
        args.concurrencies = [int(c) for c in args.concurrency.split(",") if c.strip()]
    except ValueError:
        parser.error("--concurrency wants integers, e.g. 1,32")
    if not args.concurrencies or min(args.concurrencies) < 1:
        parser.error("--concurrency wants positive integers")
    if args.requests is not None and args.requests < 1:
        parser.error("--requests must be at least 1")
    return args


def requests_for(args: argparse.Namespace, concurrency: int) -> int:
    if args.requests is not None:
        return int(args.requests)
    if args.quick:
        return 300
    return 3000 if concurrency == 1 else 10000


def _interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def main() -> int:
    args = parse_args()
    if not ARBITER.exists():
        print(f"run.py: {ARBITER} not found; run with the project's venv python", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _interrupt)  # same clean-up path as a Ctrl-C

    warmup = args.warmup if args.warmup is not None else (100 if args.quick else 500)
    body_bytes = len(request_body(GATEWAY_MODEL))
    state_bytes = len(json.dumps(STATE, separators=(",", ":")).encode())
    meta = {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "git_commit": git_commit(),
        "quick": args.quick,
        "warmup_requests": warmup,
        "state_bytes": state_bytes,
        "body_bytes": body_bytes,
        "clock_ticks_per_s": CLK_TCK,
    }
    print(f"cores: {meta['cpu_count']} (usable: {meta['cpus_usable']})   "
          f"python: {meta['python']} ({meta['implementation']})   {meta['platform']}")
    print(f"commit: {meta['git_commit']}   state: {state_bytes} B   body: {body_bytes} B   "
          f"questions: choice(4), noul, score(3)")

    workdir = Path(tempfile.mkdtemp(prefix="arbiter-bench-"))
    cluster = Cluster(workdir)
    cells: list[dict[str, Any]] = []
    failed = False
    try:
        cluster.cli("migrate")
        cluster.start("emulator", "emulate", "ollama", "--port", str(cluster.emulator_port))
        wait_http(cluster, f"http://127.0.0.1:{cluster.emulator_port}/api/version", "emulator")
        cluster.cli("service", "add", "--type", "ollama-external", "--name", "emulated-ollama",
                    "--url", f"http://127.0.0.1:{cluster.emulator_port}")
        cluster.cli("project", "create", PROJECT, "--models", "all")
        key = cluster.cli("key", "create", "--project", PROJECT).strip().splitlines()[-1].strip()
        cluster.start("arbiter", "serve", "--host", "127.0.0.1", "--port", str(cluster.arbiter_port))
        base = f"http://127.0.0.1:{cluster.arbiter_port}"
        wait_http(cluster, f"{base}/readyz", "arbiter")
        # Ready means a decision goes through, not just that the process listens.
        wait_http(cluster, f"{base}/v1/systemone", "arbiter's decision route",
                  data=request_body(GATEWAY_MODEL),
                  headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        print(f"emulator pid {cluster.procs['emulator'].pid} on :{cluster.emulator_port}, "
              f"arbiter pid {cluster.procs['arbiter'].pid} on :{cluster.arbiter_port} "
              f"(1 process, 1 worker); warm-up {warmup} requests per cell\n")

        for concurrency in args.concurrencies:
            for target in ("direct", "arbiter"):
                n = requests_for(args, concurrency)
                print(f"  {target:<8} concurrency {concurrency:>3}: {n} requests ...",
                      end="", flush=True)
                cell = run_cell(cluster, target, concurrency, n, warmup, key)
                cells.append(cell)
                print(f" {cell['throughput_rps']:.0f} req/s, p50 {cell['latency_ms']['p50']:.3f} ms,"
                      f" {cell['errors']} errors", flush=True)
    except KeyboardInterrupt:
        failed = True
        print("\ninterrupted; stopping the servers", file=sys.stderr)
    except Exception as exc:  # noqa: BLE001 - reported, then clean-up runs
        failed = True
        print(f"\nrun.py: {exc}", file=sys.stderr)
        for name in ("emulator", "arbiter"):
            tail = cluster.log_tail(name)
            if tail:
                print(f"--- {name}.log (tail) ---\n{tail}", file=sys.stderr)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # let clean-up finish
        cluster.close()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    if cells:
        print()
        print(format_table(cells))
        print("\n+p50/+p99: Arbiter minus direct at the same concurrency.  CPU ms/req: CPU time "
              "of the process during the timed phase / requests.\nloadgen util: the load "
              "generator's CPU seconds per wall second (1 process; ~100% = saturated).")
        errors = sum(c["errors"] for c in cells)
        if errors:
            print(f"\nWARNING: {errors} non-200 responses or failures: "
                  f"{[c['error_kinds'] for c in cells if c['errors']]}")
        RESULTS.mkdir(exist_ok=True)
        gitignore = RESULTS / ".gitignore"
        if not gitignore.exists():
            gitignore.write_text("*\n!.gitignore\n")
        out = RESULTS / "latest.json"
        out.write_text(json.dumps({"meta": meta, "complete": not failed, "cells": cells},
                                  indent=2) + "\n")
        print(f"\nwrote {out.relative_to(ROOT)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
