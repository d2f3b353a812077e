"""Benchmark the decision hot path: the Ollama emulator direct, Arbiter, and the LiteLLM proxy.

    .venv/bin/python bench/run.py [--quick] [--requests N] [--concurrency 1,64] [--no-litellm]
    .venv/bin/python bench/run.py --soak 100000

Sets up a throw-away deployment in a temp dir (SQLite, the Ollama emulator, one
`arbiter serve` process with one worker, and a LiteLLM proxy with one worker, each
on a free loopback port), provisions a service, a project and a key on Arbiter
through the CLI, then, for each concurrency, runs the load generator
(bench/load.py, its own process) three times with the same System One request:
straight at the emulator (the floor), through Arbiter, and through LiteLLM. Prints
a per-cell table and a side-by-side summary and writes bench/results/latest.json.
LiteLLM lives in its own virtualenv, bench/.litellm-venv, created on first use
from bench/litellm-requirements.txt.

`--soak N` sends N requests through Arbiter at concurrency 32 instead and samples
Arbiter's resident memory every few seconds (bench/results/soak-latest.json).
See bench/README.md for how to read every figure.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import secrets
import select
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
LITELLM_VENV = BENCH / ".litellm-venv"
LITELLM_REQUIREMENTS = BENCH / "litellm-requirements.txt"
LITELLM_STAMP = LITELLM_VENV / ".bench-requirements.sha256"

CLK_TCK = os.sysconf("SC_CLK_TCK")
DIRECT_MODEL = "nimble:latest"  # the emulator's own name for the model
GATEWAY_MODEL = "nimble"  # its public name on Arbiter and on LiteLLM
PROJECT = "bench"
TARGETS = ("direct", "reference", "arbiter", "litellm")
# "reference": bench/reference.py, a plain ASGI route forwarding through aiohttp (the yardstick)
GATEWAYS = ("reference", "arbiter", "litellm")
WORKERS = {"reference": 1, "arbiter": 1, "litellm": 1}  # worker processes each gateway runs
SOAK_CONCURRENCY = 32
SOAK_TARGET_MB = 50.0
QUIET_UTIL = 0.10  # "idle": the machine uses under 10% of a core
BUSY_CELL_UTIL = 0.15  # a cell during which others used more than this is rerun

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
    """The servers and whichever load generator is running; all stopped in `close`."""

    def __init__(self, workdir: Path, arbiter_log_level: str = "WARNING") -> None:
        self.workdir = workdir
        self.env = dict(os.environ,
                        ARBITER_DATABASE_URL=f"sqlite:///{workdir / 'arbiter.db'}",
                        ARBITER_LOG_LEVEL=arbiter_log_level,
                        PYTHONUNBUFFERED="1")
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.emulator_port = free_port()
        self.arbiter_port = free_port()
        self.litellm_port = free_port()
        self.reference_port = free_port()
        self.arbiter_key = ""
        self.litellm_key = "sk-bench-" + secrets.token_hex(16)

    def cli(self, *args: str) -> str:
        done = subprocess.run([str(ARBITER), *args], check=False, env=self.env,
                              cwd=self.workdir, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"arbiter {' '.join(args)} failed ({done.returncode}):\n"
                               f"{done.stdout}{done.stderr}")
        return done.stdout

    def start(self, name: str, argv: list[str],
              env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the dir
        # A session of its own: a Ctrl-C reaches only us, and `close` stops the servers
        # in order (Arbiter first, so it can flush its batched writes), then their groups.
        proc = subprocess.Popen(argv, env=env or self.env, cwd=self.workdir,
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
            if name != "loadgen" and proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}")

    def servers(self) -> dict[str, int]:
        return {name: p.pid for name, p in self.procs.items() if name != "loadgen"}

    def close(self) -> None:
        for name in ("loadgen", "arbiter", "reference", "litellm", "emulator"):
            proc = self.procs.pop(name, None)
            if proc is None:
                continue
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT if name == "loadgen" else signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)
            if name != "loadgen":
                # Whatever the server forked is in its own process group: end it too.
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_http(cluster: Cluster, url: str, what: str, timeout: float = 30.0,
              data: bytes | None = None, headers: dict[str, str] | None = None) -> bytes:
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        cluster.check_alive()
        request = urllib.request.Request(url, data=data, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                if response.status == 200:
                    return bytes(response.read())
                last = f"HTTP {response.status}"
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}: {exc.read()[:300]!r}"
        except OSError as exc:
            last = repr(exc)
        time.sleep(0.2)
    raise RuntimeError(f"{what} not ready after {timeout:.0f}s ({last})")


# -- /proc ----------------------------------------------------------------------------

def _stat_fields(pid: int) -> list[bytes]:
    with open(f"/proc/{pid}/stat", "rb") as handle:
        raw = handle.read()
    return raw[raw.rindex(b")") + 2:].split()  # fields[0] is field 3 (state)


def tree_pids(root: int) -> list[int]:
    """`root` and all its live descendants, from the ppid fields in /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            ppid = int(_stat_fields(int(entry))[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def tree_cpu_ticks(root: int) -> int:
    """CPU clock ticks of a process tree: utime + stime (all threads) of every live
    process in it, plus cutime + cstime (children it has already reaped)."""
    total = 0
    for pid in tree_pids(root):
        try:
            fields = _stat_fields(pid)
        except (OSError, ValueError):
            continue  # exited between the listing and now
        total += sum(int(fields[i]) for i in (11, 12, 13, 14))  # fields 14-17
    return total


def machine_busy_ticks() -> int:
    """Non-idle CPU ticks of the whole machine, all cores (the `cpu` line of /proc/stat)."""
    with open("/proc/stat") as handle:
        fields = [int(v) for v in handle.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal (guest time is already in user)
    return sum(fields[:3]) + sum(fields[5:8])


def machine_util(seconds: float) -> float:
    """The whole machine's CPU seconds per wall second over the next `seconds`."""
    busy, wall = machine_busy_ticks(), time.monotonic()
    time.sleep(seconds)
    return (machine_busy_ticks() - busy) / CLK_TCK / (time.monotonic() - wall)


def wait_quiet(cluster: Cluster, max_wait: float) -> tuple[float, bool]:
    """Wait (at most `max_wait` s) until the machine has used under 10% of a core in two
    one-second windows in a row. Between cells our servers are idle, so anything
    busy is someone else. Returns the seconds waited and whether it got quiet."""
    start, quiet = time.monotonic(), 0
    while time.monotonic() - start < max_wait:
        cluster.check_alive()
        quiet = quiet + 1 if machine_util(1.0) < QUIET_UTIL else 0
        if quiet >= 2:
            return time.monotonic() - start, True
    return time.monotonic() - start, max_wait <= 0


def rss_mb(pid: int) -> float:
    """Resident memory of one process in MiB (VmRSS in /proc/<pid>/status)."""
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def tree_rss_mb(root: int) -> float:
    total = 0.0
    for pid in tree_pids(root):
        try:
            total += rss_mb(pid)
        except OSError:
            continue
    return total


# -- LiteLLM --------------------------------------------------------------------------

def _requirements_hash() -> str:
    return hashlib.sha256(LITELLM_REQUIREMENTS.read_bytes()).hexdigest()


def ensure_litellm() -> str:
    """Create bench/.litellm-venv and install LiteLLM into it if needed; its version."""
    python = LITELLM_VENV / "bin" / "python"
    if not python.exists():
        base = shutil.which("python3") or str(getattr(sys, "_base_executable", sys.executable))
        print(f"creating {LITELLM_VENV.relative_to(ROOT)} ({base} -m venv) ...", flush=True)
        subprocess.run([base, "-m", "venv", str(LITELLM_VENV)], check=True, timeout=300)
    stamp = LITELLM_STAMP.read_text().strip() if LITELLM_STAMP.exists() else ""
    if stamp != _requirements_hash():
        print(f"installing {LITELLM_REQUIREMENTS.relative_to(ROOT)} into "
              f"{LITELLM_VENV.relative_to(ROOT)} (one-off, a minute or two) ...", flush=True)
        done = subprocess.run(
            [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q",
             "-r", str(LITELLM_REQUIREMENTS)],
            check=False, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-25:])
            raise RuntimeError(f"pip could not install LiteLLM ({done.returncode}); "
                               f"rerun with --no-litellm to skip it:\n{tail}")
        LITELLM_STAMP.write_text(_requirements_hash() + "\n")
    done = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
        check=True, capture_output=True, text=True, timeout=60)
    return done.stdout.strip()


# The proxy's settings, kept as lean as its docs and code allow: one uvicorn worker,
# no database (so no spend logs, no key table, no UI), no callbacks, no retries,
# no telemetry, no per-request access log, the bundled model cost map (no fetch).
LITELLM_ENV = {
    "LITELLM_TELEMETRY": "False",           # the switch older releases read
    "LITELLM_TELEMETRY_DISABLED": "true",   # the veto 1.110 reads (litellm/proxy/telemetry)
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no network fetch of the price list at start-up
    "LITELLM_LOG": "ERROR",                  # also uvicorn's level: no access log line per request
    "LITELLM_MODE": "PRODUCTION",            # no .env loading
    "DISABLE_ADMIN_UI": "True",
    "LITELLM_DONT_SHOW_FEEDBACK_BOX": "True",
    "PYTHONUNBUFFERED": "1",
}
LITELLM_UNSET = ("DATABASE_URL", "DIRECT_URL", "REDIS_HOST", "REDIS_URL", "REDIS_PORT",
                 "STORE_MODEL_IN_DB", "LITELLM_MASTER_KEY")


def litellm_config(cluster: Cluster) -> dict[str, Any]:
    return {
        "model_list": [{
            "model_name": GATEWAY_MODEL,
            "litellm_params": {"model": f"ollama/{DIRECT_MODEL}",
                               "api_base": f"http://127.0.0.1:{cluster.emulator_port}"},
        }],
        "litellm_settings": {"callbacks": [], "num_retries": 0, "request_timeout": 60},
        "general_settings": {"master_key": cluster.litellm_key, "disable_spend_logs": True,
                             "disable_error_logs": True},
    }


def start_litellm(cluster: Cluster) -> list[str]:
    config = cluster.workdir / "litellm-config.yaml"
    config.write_text(json.dumps(litellm_config(cluster), indent=2) + "\n")  # JSON is YAML
    env = {k: v for k, v in os.environ.items() if k not in LITELLM_UNSET}
    env.update(LITELLM_ENV)
    argv = [str(LITELLM_VENV / "bin" / "litellm"), "--config", str(config),
            "--host", "127.0.0.1", "--port", str(cluster.litellm_port),
            "--num_workers", str(WORKERS["litellm"])]
    cluster.start("litellm", argv, env=env)
    base = f"http://127.0.0.1:{cluster.litellm_port}"
    wait_http(cluster, f"{base}/health/liveliness", "litellm", timeout=180)
    answer = wait_http(cluster, f"{base}/v1/systemone", "litellm's /v1/systemone", timeout=60,
                       data=request_body(GATEWAY_MODEL),
                       headers={"Authorization": f"Bearer {cluster.litellm_key}",
                                "Content-Type": "application/json"})
    model = json.loads(answer).get("model")
    if model not in (GATEWAY_MODEL, DIRECT_MODEL):
        raise RuntimeError(f"litellm answered for model {model!r}: {answer[:300]!r}")
    return argv


# -- one cell -------------------------------------------------------------------------

def target_request(cluster: Cluster, target: str) -> tuple[str, bytes, list[str], str]:
    """URL, body, load.py header arguments and the `model` the answers must carry."""
    if target == "direct":
        return (f"http://127.0.0.1:{cluster.emulator_port}/v1/systemone",
                request_body(DIRECT_MODEL), [], DIRECT_MODEL)
    if target == "reference":
        return (f"http://127.0.0.1:{cluster.reference_port}/v1/systemone",
                request_body(GATEWAY_MODEL), [], GATEWAY_MODEL)
    if target == "arbiter":
        return (f"http://127.0.0.1:{cluster.arbiter_port}/v1/systemone",
                request_body(GATEWAY_MODEL),
                ["--header", f"Authorization: Bearer {cluster.arbiter_key}"], GATEWAY_MODEL)
    # LiteLLM passes the backend's `model` through (nimble:latest), not its alias.
    return (f"http://127.0.0.1:{cluster.litellm_port}/v1/systemone",
            request_body(GATEWAY_MODEL),
            ["--header", f"Authorization: Bearer {cluster.litellm_key}"], DIRECT_MODEL)


def start_loadgen(cluster: Cluster, target: str, concurrency: int, requests: int,
                  warmup: int) -> subprocess.Popen[bytes]:
    url, body, headers, expect = target_request(cluster, target)
    body_file = cluster.workdir / f"body-{target}.json"
    body_file.write_bytes(body)
    cmd = [sys.executable, str(BENCH / "load.py"), "--url", url, "--body-file", str(body_file),
           "--requests", str(requests), "--concurrency", str(concurrency),
           "--warmup", str(warmup), "--expect-model", expect, "--handshake", *headers]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT)
    cluster.procs["loadgen"] = proc
    return proc


def wait_warm(proc: subprocess.Popen[bytes]) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    event = json.loads(line) if line.strip() else {}
    if event.get("event") != "warm":
        rest = proc.stdout.read()
        proc.wait()
        raise RuntimeError(f"load generator failed in warm-up: {(line + rest).decode()}")


def send_go(proc: subprocess.Popen[bytes]) -> None:
    assert proc.stdin is not None
    proc.stdin.write(b"go\n")
    proc.stdin.flush()


def stop_loadgen(cluster: Cluster, proc: subprocess.Popen[bytes]) -> None:
    cluster.procs.pop("loadgen", None)
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def finish_loadgen(cluster: Cluster, proc: subprocess.Popen[bytes], line: bytes) -> dict[str, Any]:
    try:
        proc.wait(timeout=30)
    finally:
        stop_loadgen(cluster, proc)
    if not line.strip():
        raise RuntimeError(f"load generator exited with {proc.returncode} and no result")
    result: dict[str, Any] = json.loads(line)
    if "fatal" in result:
        raise RuntimeError(f"load generator: {result}")
    return result


def run_cell(cluster: Cluster, target: str, concurrency: int, requests: int,
             warmup: int) -> dict[str, Any]:
    proc = start_loadgen(cluster, target, concurrency, requests, warmup)
    assert proc.stdout is not None
    try:
        wait_warm(proc)
        servers = cluster.servers()
        ours = {**servers, "loadgen": proc.pid}
        busy_before, wall_before = machine_busy_ticks(), time.monotonic()
        before = {name: tree_cpu_ticks(pid) for name, pid in ours.items()}
        send_go(proc)
        line = proc.stdout.readline()
        after = {name: tree_cpu_ticks(pid) for name, pid in ours.items()}
        busy_after, wall_after = machine_busy_ticks(), time.monotonic()
        rss = {name: tree_rss_mb(pid) for name, pid in servers.items()}
        result = finish_loadgen(cluster, proc, line)
    finally:
        stop_loadgen(cluster, proc)
    result["target"] = target
    result["server_cpu_s"] = {name: (after[name] - before[name]) / CLK_TCK for name in servers}
    result["server_cpu_ms_per_request"] = {
        name: seconds * 1000.0 / requests for name, seconds in result["server_cpu_s"].items()
    }
    result["server_rss_mb_after"] = rss
    # Everything else the machine ran meanwhile (other processes, kernel work not
    # charged to ours), in CPU seconds per wall second: on a shared box, a cell with
    # a high figure here was measured with less CPU than the others.
    ours_ticks = sum(after[name] - before[name] for name in ours)
    result["other_cpu_s"] = (busy_after - busy_before - ours_ticks) / CLK_TCK
    result["other_cpu_utilization"] = result["other_cpu_s"] / max(wall_after - wall_before, 1e-9)
    cluster.check_alive()
    return result


def measure(cluster: Cluster, args: argparse.Namespace, target: str, concurrency: int, round_: int,
            warmup: int) -> dict[str, Any]:
    """One cell, rerun (up to --retries times) when the rest of the machine was busy meanwhile."""
    n = requests_for(args, concurrency)
    print(f"  {target:<8} concurrency {concurrency:>3}" + (f" round {round_}" if args.rounds > 1 else "")
          + f": {n} requests ...", end="", flush=True)
    discarded: list[float] = []
    while True:
        waited, quiet = wait_quiet(cluster, args.idle_wait)
        if waited >= 3:
            print(f" [waited {waited:.0f}s for a quiet machine"
                  f"{'' if quiet else ', in vain'}]", end="", flush=True)
        cell = run_cell(cluster, target, concurrency, n, warmup)
        busy = cell["other_cpu_utilization"] > BUSY_CELL_UTIL and cell["wall_s"] >= 1.0
        if not busy or len(discarded) >= args.retries:
            break
        discarded.append(cell["other_cpu_utilization"])
        print(f" [others used {discarded[-1] * 100:.0f}% of a core: again]", end="", flush=True)
    cell["discarded_attempts_other_util"] = discarded
    cell["round"] = round_
    print(f" {cell['throughput_rps']:.0f} req/s, p50 "
          f"{cell['latency_ms']['p50']:.3f} ms, {cell['errors']} errors", flush=True)
    return cell


# -- soak -----------------------------------------------------------------------------

def run_soak(cluster: Cluster, requests: int, warmup: int, interval: float) -> dict[str, Any]:
    pid = cluster.procs["arbiter"].pid
    t0 = time.monotonic()
    samples: list[tuple[float, float]] = [(0.0, rss_mb(pid))]  # before any load
    proc = start_loadgen(cluster, "arbiter", SOAK_CONCURRENCY, requests, warmup)
    assert proc.stdout is not None
    try:
        wait_warm(proc)
        warm_rss = rss_mb(pid)
        samples.append((time.monotonic() - t0, warm_rss))
        send_go(proc)
        next_sample = time.monotonic() + interval
        while True:
            ready, _, _ = select.select([proc.stdout], [], [], max(0.0, next_sample - time.monotonic()))
            if ready:
                line = proc.stdout.readline()
                break
            now = time.monotonic()
            samples.append((now - t0, rss_mb(pid)))
            print(f"  t={now - t0:6.1f}s  arbiter RSS {samples[-1][1]:7.1f} MB", flush=True)
            next_sample = now + interval
            cluster.check_alive()
        samples.append((time.monotonic() - t0, rss_mb(pid)))
        result = finish_loadgen(cluster, proc, line)
    finally:
        stop_loadgen(cluster, proc)
    start, end = samples[0][1], samples[-1][1]
    peak = max(rss for _, rss in samples)
    result.update({
        "target": "arbiter",
        "rss_samples_mb": [{"t_s": round(t, 2), "rss_mb": round(r, 2)} for t, r in samples],
        "rss_start_mb": start,
        "rss_after_warmup_mb": warm_rss,
        "rss_peak_mb": peak,
        "rss_end_mb": end,
        "rss_growth_mb": end - start,
        "rss_growth_after_warmup_mb": end - warm_rss,
        "target_growth_mb": SOAK_TARGET_MB,
        "pass": end - start < SOAK_TARGET_MB,
    })
    return result


# -- output ---------------------------------------------------------------------------

def render(columns: list[tuple[str, str]], rows: list[list[str]]) -> str:
    widths = [max(len(name), *(len(r[i]) for r in rows)) for i, (name, _) in enumerate(columns)]

    def line(values: list[str]) -> str:
        return "  ".join(f"{v:{align}{w}}" for v, (_, align), w in zip(values, columns, widths))

    out = [line([name for name, _ in columns]), line(["-" * w for w in widths])]
    out += [line(r) for r in rows]
    return "\n".join(out)


CELL_COLUMNS = [
    ("target", "<"), ("conc", ">"), ("requests", ">"), ("errors", ">"), ("req/s", ">"),
    ("p50 ms", ">"), ("p99 ms", ">"), ("+p50 ms", ">"), ("+p99 ms", ">"),
    ("gateway CPU ms/req", ">"), ("emu CPU ms/req", ">"), ("loadgen CPU ms/req", ">"),
    ("loadgen util", ">"), ("other util", ">"),
]


def _floor(cells: list[dict[str, Any]], cell: dict[str, Any]) -> dict[str, Any] | None:
    """The direct cell a cell is compared with: same concurrency, same round (else the first)."""
    if cell["target"] == "direct":
        return None
    same = [c for c in cells if c["target"] == "direct" and c["concurrency"] == cell["concurrency"]]
    return next((c for c in same if c.get("round") == cell.get("round")), same[0] if same else None)


def format_cells(cells: list[dict[str, Any]]) -> str:
    rows = []
    for c in cells:
        lat = c["latency_ms"]
        floor = _floor(cells, c)
        added = [f"{lat[q] - floor['latency_ms'][q]:.3f}" if floor else "-" for q in ("p50", "p99")]
        cpu = c["server_cpu_ms_per_request"]
        rows.append([
            c["target"] + (f" r{c['round']}" if "round" in c else ""), str(c["concurrency"]), str(c["requests"]),
            str(c["errors"]),
            f"{c['throughput_rps']:.0f}", f"{lat['p50']:.3f}", f"{lat['p99']:.3f}", *added,
            f"{cpu[c['target']]:.3f}" if c["target"] in GATEWAYS else "-",
            f"{cpu['emulator']:.3f}",
            f"{c['loadgen_cpu_ms_per_request']:.3f}",
            f"{c['loadgen_cpu_utilization'] * 100:.0f}%",
            f"{c['other_cpu_utilization'] * 100:.0f}%"
            + ("!" if c["other_cpu_utilization"] > BUSY_CELL_UTIL and c["wall_s"] >= 1.0 else ""),
        ])
    return render(CELL_COLUMNS, rows)


def summarize(cells: list[dict[str, Any]], concurrencies: list[int]) -> list[dict[str, Any]]:
    """One row per target: throughput and CPU at the highest concurrency, added latency at each.

    With several rounds, each figure is the median over the rounds, and a share of direct or an
    added latency is taken against the direct cell of the same round (``*_rounds``: every round's)."""
    top = max(concurrencies)
    out = []
    for target in TARGETS:
        mine = [c for c in cells if c["target"] == target]
        if not mine:
            continue
        row: dict[str, Any] = {"target": target, "workers": WORKERS.get(target),
                               "errors": sum(c["errors"] for c in mine)}
        high = [c for c in mine if c["concurrency"] == top]
        if high:
            row["decisions_per_s"] = median([c["throughput_rps"] for c in high])
            shares = [c["throughput_rps"] / floor["throughput_rps"]
                      for c in high if (floor := _floor(cells, c) if target != "direct" else c)]
            row["vs_direct"] = median(shares) if shares else None
            row["vs_direct_rounds"] = shares
            row["gateway_cpu_ms_per_decision"] = (
                median([c["server_cpu_ms_per_request"][target] for c in high]) if target in GATEWAYS else None)
            row["backend_cpu_ms_per_decision"] = median([c["server_cpu_ms_per_request"]["emulator"] for c in high])
        for conc in concurrencies:
            for q in ("p50", "p99"):
                added = [c["latency_ms"][q] - floor["latency_ms"][q]
                         for c in mine if c["concurrency"] == conc and (floor := _floor(cells, c))]
                row[f"added_{q}_ms_c{conc}"] = median(added) if added else None
                row[f"added_{q}_ms_c{conc}_rounds"] = added
        out.append(row)
    return out


def format_reference(summary: list[dict[str, Any]], concurrencies: list[int]) -> str:
    """Arbiter next to the reference forwarder of the same run: what its gateway work costs
    over the thinnest Python forwarder, on this machine."""
    rows = {r["target"]: r for r in summary}
    arbiter, reference = rows.get("arbiter"), rows.get("reference")
    if not arbiter or not reference:
        return ""
    top = max(concurrencies)
    parts = []
    mine, theirs = arbiter.get("gateway_cpu_ms_per_decision"), reference.get("gateway_cpu_ms_per_decision")
    if mine and theirs:
        parts.append(f"CPU per decision @{top}: arbiter {mine:.3f} ms, reference {theirs:.3f} ms "
                     f"({mine / theirs:.2f}x)")
    for conc in concurrencies:
        a, b = arbiter.get(f"added_p50_ms_c{conc}"), reference.get(f"added_p50_ms_c{conc}")
        if a is not None and b is not None:
            parts.append(f"+p50 @{conc}: arbiter {a:.3f} ms, reference {b:.3f} ms")
    return ("Against the reference forwarder (bench/reference.py: uvicorn, a plain ASGI route, aiohttp; "
            "nothing else):\n  " + "\n  ".join(parts))


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def format_summary(summary: list[dict[str, Any]], concurrencies: list[int]) -> str:
    top = max(concurrencies)
    columns = [("target", "<"), ("workers", ">"), (f"decisions/s @{top}", ">"),
               ("of direct", ">")]
    for conc in concurrencies:
        columns += [(f"+p50 ms @{conc}", ">"), (f"+p99 ms @{conc}", ">")]
    columns += [(f"CPU ms/decision @{top}", ">"), ("emu CPU ms/req", ">"), ("errors", ">")]

    def num(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    rows = []
    for r in summary:
        row = [r["target"], str(r["workers"]) if r["workers"] else "-",
               num(r.get("decisions_per_s"), ".0f"),
               "-" if r.get("vs_direct") is None else f"{r['vs_direct'] * 100:.1f}%"]
        for conc in concurrencies:
            row += [num(r[f"added_p50_ms_c{conc}"], ".3f"), num(r[f"added_p99_ms_c{conc}"], ".3f")]
        row += [num(r.get("gateway_cpu_ms_per_decision"), ".3f"),
                num(r.get("backend_cpu_ms_per_decision"), ".3f"), str(r.get("errors", "-"))]
        rows.append(row)
    return render(columns, rows)


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


def write_results(name: str, doc: dict[str, Any]) -> Path:
    RESULTS.mkdir(exist_ok=True)
    gitignore = RESULTS / ".gitignore"
    if not gitignore.exists():
        gitignore.write_text("*\n!.gitignore\n")
    out = RESULTS / name
    out.write_text(json.dumps(doc, indent=2) + "\n")
    return out


# -- main -----------------------------------------------------------------------------

def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="a short smoke run (300 requests per cell, short warm-up)")
    parser.add_argument("--requests", type=int, default=None,
                        help="timed requests per cell (default: 3,000 at concurrency 1, "
                             "10,000 above; 300 with --quick)")
    parser.add_argument("--concurrency", default="1,64",
                        help="comma-separated concurrencies (default: 1,64)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="untimed requests before each cell (default 500; 100 with --quick)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="run the direct and Arbiter cells this many times, interleaved, and report "
                             "the median of the per-round figures, each against the same round's direct "
                             "cell (default 3; LiteLLM runs in the first round only)")
    parser.add_argument("--no-litellm", action="store_true",
                        help="leave out the LiteLLM proxy (no virtualenv, no install)")
    parser.add_argument("--no-reference", action="store_true",
                        help="leave out the reference forwarder (bench/reference.py: a plain ASGI route "
                             "forwarding through aiohttp, nothing else on its path)")
    parser.add_argument("--soak", type=int, nargs="?", const=100_000, default=None, metavar="N",
                        help="instead of the table: N requests (default 100,000) through Arbiter "
                             f"at concurrency {SOAK_CONCURRENCY}, sampling its RSS")
    parser.add_argument("--soak-interval", type=float, default=3.0,
                        help="seconds between RSS samples in --soak (default 3)")
    parser.add_argument("--idle-wait", type=float, default=300.0,
                        help="before each cell, wait up to this many seconds for the machine "
                             "to be quiet (default 300; 0: don't wait)")
    parser.add_argument("--retries", type=int, default=2,
                        help="rerun a cell (of 1 s or more) during which other processes used "
                             f"over {BUSY_CELL_UTIL * 100:.0f}%% of a core, up to this many times "
                             "(default 2)")
    parser.add_argument("--arbiter-log-level", default="WARNING", type=str.upper,
                        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                        help="Arbiter's ARBITER_LOG_LEVEL (default WARNING: no access line per request, "
                             "like LiteLLM's lean settings; INFO, Arbiter's own default, writes one JSON "
                             "line per request to its log file)")
    parser.add_argument("--paired-blocks", type=int, default=None, metavar="N",
                        help="after the cells, the paired measurement at concurrency 1 (bench/paired.py): "
                             "N blocks of sequential requests per target, in turn (default 20; 3 with "
                             "--quick; 0: leave it out)")
    parser.add_argument("--paired-block-size", type=int, default=None, metavar="N",
                        help="requests per block of the paired measurement (default 200; 50 with --quick)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the temp dir (database, configs, server logs) and print its path")
    args = parser.parse_args()
    try:
        args.concurrencies = [int(c) for c in args.concurrency.split(",") if c.strip()]
    except ValueError:
        parser.error("--concurrency wants integers, e.g. 1,64")
    if not args.concurrencies or min(args.concurrencies) < 1:
        parser.error("--concurrency wants positive integers")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.requests is not None and args.requests < 1:
        parser.error("--requests must be at least 1")
    if args.soak is not None and args.soak < 1:
        parser.error("--soak wants a positive number of requests")
    if args.paired_blocks is None:
        args.paired_blocks = 3 if args.quick else 20
    if args.paired_block_size is None:
        args.paired_block_size = 50 if args.quick else 200
    if args.paired_blocks < 0 or args.paired_block_size < 1:
        parser.error("--paired-blocks wants 0 or more, --paired-block-size 1 or more")
    return args


def requests_for(args: argparse.Namespace, concurrency: int) -> int:
    if args.requests is not None:
        return int(args.requests)
    if args.quick:
        return 300
    return 3000 if concurrency == 1 else 10000


def run_paired(cluster: Cluster, targets: list[str], blocks: int, block_size: int,
               warmup: int) -> dict[str, Any]:
    """bench/paired.py over ``targets`` (direct first: the floor), after waiting for a quiet machine."""
    argv = [sys.executable, str(BENCH / "paired.py"), "--blocks", str(blocks), "--block-size", str(block_size),
            "--warmup", str(warmup)]
    for target in targets:
        url, body, headers, expect = target_request(cluster, target)
        body_file = cluster.workdir / f"body-{target}.json"
        body_file.write_bytes(body)
        argv += ["--target", target, url, str(body_file), expect]
        for flag, header in zip(headers[::2], headers[1::2], strict=True):
            assert flag == "--header"
            argv += ["--header", target, header]
    wait_quiet(cluster, 300.0)
    timeout = 120 + blocks * block_size * len(targets) * 0.1  # 100 ms a request: far past LiteLLM's 12
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=False)
    result: dict[str, Any] = json.loads(done.stdout) if done.stdout.strip() else {
        "fatal": f"exit {done.returncode}: {done.stderr[-2000:]}"}
    if "fatal" in result:
        raise RuntimeError(f"paired measurement: {result['fatal']}")
    result["blocks"], result["block_size"] = blocks, block_size
    return result


def format_paired(paired: dict[str, Any], targets: list[str]) -> str:
    """The paired table: each target against the first (direct), overall and block by block."""
    floor = paired[targets[0]]
    rows = []
    for target in targets:
        row = paired[target]
        if target == targets[0]:
            rows.append([target, f"{row['p50']:.3f}", f"{row['p99']:.3f}", "-", "-", "-"])
            continue
        per_block = [b - d for b, d in zip(row["block_p50"], floor["block_p50"], strict=True)]
        rows.append([target, f"{row['p50']:.3f}", f"{row['p99']:.3f}", f"{row['p50'] - floor['p50']:.3f}",
                     f"{row['p99'] - floor['p99']:.3f}",
                     f"{median(per_block):.3f} ({min(per_block):.3f} to {max(per_block):.3f})"])
    columns = [("target", "<"), ("p50 ms", ">"), ("p99 ms", ">"), ("+p50 ms", ">"), ("+p99 ms", ">"),
               ("+p50 per block: median (range)", ">")]
    return render(columns, rows)


def _interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def start_reference(cluster: Cluster) -> None:
    cluster.start("reference", [sys.executable, str(BENCH / "reference.py"), "--port", str(cluster.reference_port),
                                "--backend", f"http://127.0.0.1:{cluster.emulator_port}",
                                "--public", GATEWAY_MODEL, "--backend-model", DIRECT_MODEL])
    wait_http(cluster, f"http://127.0.0.1:{cluster.reference_port}/v1/systemone", "the reference forwarder",
              data=request_body(GATEWAY_MODEL), headers={"Content-Type": "application/json"})


def setup_arbiter(cluster: Cluster) -> None:
    cluster.cli("service", "add", "--type", "ollama-external", "--name", "emulated-ollama",
                "--url", f"http://127.0.0.1:{cluster.emulator_port}")
    cluster.cli("project", "create", PROJECT, "--models", "all")
    cluster.arbiter_key = cluster.cli("key", "create", "--project", PROJECT
                                      ).strip().splitlines()[-1].strip()
    cluster.start("arbiter", [str(ARBITER), "serve", "--host", "127.0.0.1",
                              "--port", str(cluster.arbiter_port)])
    base = f"http://127.0.0.1:{cluster.arbiter_port}"
    wait_http(cluster, f"{base}/readyz", "arbiter")
    # Ready means a decision goes through, not just that the process listens.
    wait_http(cluster, f"{base}/v1/systemone", "arbiter's decision route",
              data=request_body(GATEWAY_MODEL),
              headers={"Authorization": f"Bearer {cluster.arbiter_key}",
                       "Content-Type": "application/json"})


def main() -> int:
    args = parse_args()
    if not ARBITER.exists():
        print(f"run.py: {ARBITER} not found; run with the project's venv python", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _interrupt)  # same clean-up path as a Ctrl-C

    soak = args.soak is not None
    with_litellm = not args.no_litellm and not soak
    with_reference = not args.no_reference and not soak
    litellm_version = None
    if with_litellm:
        try:
            litellm_version = ensure_litellm()
        except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
            print(f"run.py: {exc}", file=sys.stderr)
            return 2

    warmup = args.warmup if args.warmup is not None else (100 if args.quick else 500)
    body_bytes = len(request_body(GATEWAY_MODEL))
    state_bytes = len(json.dumps(STATE, separators=(",", ":")).encode())
    meta = {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "cpu_model": _cpu_model(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "git_commit": git_commit(),
        "litellm_version": litellm_version,
        "arbiter_log_level": args.arbiter_log_level,
        "workers": {"arbiter": WORKERS["arbiter"],
                    **({"reference": WORKERS["reference"]} if with_reference else {}),
                    **({"litellm": WORKERS["litellm"]} if with_litellm else {})},
        "quick": args.quick,
        "warmup_requests": warmup,
        "state_bytes": state_bytes,
        "body_bytes": body_bytes,
        "clock_ticks_per_s": CLK_TCK,
    }
    print(f"date: {meta['started_at']}   cores: {meta['cpu_count']} (usable: "
          f"{meta['cpus_usable']}) {meta['cpu_model'] or ''}")
    print(f"python: {meta['python']} ({meta['implementation']})   litellm: "
          f"{litellm_version or '-'}   {meta['platform']}")
    print(f"commit: {meta['git_commit']}   state: {state_bytes} B   body: {body_bytes} B   "
          f"questions: choice(4), noul, score(3)")
    meta["busy_before_start"] = machine_util(2.0)
    print(f"machine busy before start: {meta['busy_before_start'] * 100:.0f}% of a core"
          + ("   (something else is running: each cell waits for quiet first)"
             if meta["busy_before_start"] > QUIET_UTIL else ""))

    workdir = Path(tempfile.mkdtemp(prefix="arbiter-bench-"))
    cluster = Cluster(workdir, args.arbiter_log_level)
    cells: list[dict[str, Any]] = []
    paired: dict[str, Any] | None = None
    soak_result: dict[str, Any] | None = None
    failed = False
    try:
        cluster.cli("migrate")
        cluster.start("emulator", [str(ARBITER), "emulate", "ollama",
                                   "--port", str(cluster.emulator_port)])
        wait_http(cluster, f"http://127.0.0.1:{cluster.emulator_port}/api/version", "emulator")
        setup_arbiter(cluster)
        if with_reference:
            start_reference(cluster)
        procs = {"emulator": len(tree_pids(cluster.procs["emulator"].pid)),
                 "arbiter": len(tree_pids(cluster.procs["arbiter"].pid))}
        if with_litellm:
            print("starting the LiteLLM proxy ...", flush=True)
            meta["litellm_argv"] = start_litellm(cluster)
            meta["litellm_env"] = LITELLM_ENV
            meta["litellm_config"] = {**litellm_config(cluster),
                                      "general_settings": {"master_key": "<random>",
                                                           "disable_spend_logs": True,
                                                           "disable_error_logs": True}}
            procs["litellm"] = len(tree_pids(cluster.procs["litellm"].pid))
        meta["processes"] = procs
        print(f"emulator :{cluster.emulator_port} ({procs['emulator']} process), arbiter "
              f":{cluster.arbiter_port} ({WORKERS['arbiter']} worker, {procs['arbiter']} "
              f"process)"
              + (f", reference :{cluster.reference_port} ({WORKERS['reference']} worker)"
                 if with_reference else "")
              + (f", litellm :{cluster.litellm_port} ({WORKERS['litellm']} worker, "
                 f"{procs['litellm']} process)" if with_litellm else ""))
        print(f"arbiter log level: {args.arbiter_log_level}"
              + (" (an access line per request)" if args.arbiter_log_level in ("DEBUG", "INFO")
                 else " (no access line per request)"))

        if soak:
            print(f"soak: {args.soak} requests through Arbiter at concurrency "
                  f"{SOAK_CONCURRENCY} (warm-up {warmup}), RSS every {args.soak_interval:g}s\n",
                  flush=True)
            soak_result = run_soak(cluster, args.soak, warmup, args.soak_interval)
        else:
            print(f"warm-up {warmup} requests per cell (answers checked)\n", flush=True)
            targets = [t for t in TARGETS if (with_litellm or t != "litellm") and (with_reference or t != "reference")]
            meta["rounds"] = args.rounds
            plan = [(concurrency, round_, target) for concurrency in args.concurrencies
                    for round_ in range(1, args.rounds + 1) for target in targets
                    if target != "litellm" or round_ == 1]  # LiteLLM: ~30x slower, one round
            for concurrency, round_, target in plan:
                cell = measure(cluster, args, target, concurrency, round_, warmup)
                cells.append(cell)
            if args.paired_blocks:
                print(f"paired at concurrency 1: {args.paired_blocks} blocks of {args.paired_block_size} "
                      f"requests per target, in turn ...", flush=True)
                paired = run_paired(cluster, targets, args.paired_blocks, args.paired_block_size, warmup)
    except KeyboardInterrupt:
        failed = True
        print("\ninterrupted; stopping the servers", file=sys.stderr)
    except Exception as exc:  # noqa: BLE001 - reported, then clean-up runs
        failed = True
        print(f"\nrun.py: {exc}", file=sys.stderr)
        for name in ("emulator", "arbiter", "reference", "litellm"):
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

    if soak_result is not None:
        r = soak_result
        lat = r["latency_ms"]
        print(f"\nsoak: {r['requests']} requests at concurrency {SOAK_CONCURRENCY}, "
              f"{r['errors']} errors, {r['throughput_rps']:.0f} req/s, p50 {lat['p50']:.3f} ms, "
              f"p99 {lat['p99']:.3f} ms, {r['wall_s']:.1f} s")
        print(f"arbiter RSS  start {r['rss_start_mb']:.1f} MB   after warm-up "
              f"{r['rss_after_warmup_mb']:.1f} MB   peak {r['rss_peak_mb']:.1f} MB   end "
              f"{r['rss_end_mb']:.1f} MB")
        print(f"growth {r['rss_growth_mb']:+.1f} MB (start to end; "
              f"{r['rss_growth_after_warmup_mb']:+.1f} MB after warm-up), peak - start "
              f"{r['rss_peak_mb'] - r['rss_start_mb']:+.1f} MB; target < {SOAK_TARGET_MB:.0f} MB: "
              f"{'PASS' if r['pass'] else 'FAIL'}")
        if r["errors"]:
            print(f"WARNING: {r['errors']} failures: {r['error_kinds']}")
        out = write_results("soak-latest.json",
                            {"meta": meta, "complete": not failed, "soak": soak_result})
        print(f"\nwrote {out.relative_to(ROOT)}")
        return 1 if failed or not r["pass"] else 0

    if cells:
        summary = summarize(cells, args.concurrencies)
        print()
        print(format_cells(cells))
        print("\n+p50/+p99: the target minus direct at the same concurrency.  CPU ms/req: CPU "
              "time of the process tree during the timed phase / requests.\nloadgen util: the "
              "load generator's CPU seconds per wall second (1 process; ~100% = saturated).\nother util: CPU "
              "seconds per wall second that the rest of the machine used meanwhile (should be ~0;\n"
              f"'!': over {BUSY_CELL_UTIL:.0%} even after {args.retries} reruns, so that cell's "
              "latency and throughput are off).")
        print(f"\nSide by side (workers: arbiter {WORKERS['arbiter']}"
              + (f", reference {WORKERS['reference']}" if with_reference else "")
              + (f", litellm {WORKERS['litellm']}" if with_litellm else "") + "):\n")
        print(format_summary(summary, args.concurrencies))
        if with_reference:
            print("\n" + format_reference(summary, args.concurrencies))
        if args.rounds > 1:
            print(f"\n{args.rounds} rounds, interleaved; the table shows their medians. Every round:")
            for row in summary:
                if row["target"] not in ("arbiter", "reference"):
                    continue
                parts = [f"+p50 @{conc}: " + ", ".join(f"{v:.3f}" for v in row[f"added_p50_ms_c{conc}_rounds"])
                         for conc in args.concurrencies]
                parts.append("of direct @" + str(max(args.concurrencies)) + ": "
                             + ", ".join(f"{v * 100:.1f}%" for v in row.get("vs_direct_rounds", [])))
                print(f"  {row['target']}: " + "; ".join(parts))
        if paired is not None:
            print(f"\nPaired at concurrency 1 (bench/paired.py): {paired['blocks']} blocks of {paired['block_size']} "
                  "sequential requests per target, in turn, from one plain-socket client; + is against direct, "
                  "over all requests and block by block:\n")
            print(format_paired(paired, targets))
        errors = sum(c["errors"] for c in cells)
        if errors:
            print(f"\nWARNING: {errors} non-200 responses or failures: "
                  f"{ {c['target'] + '@' + str(c['concurrency']): c['error_kinds'] for c in cells if c['errors']} }")
        out = write_results("latest.json", {"meta": meta, "complete": not failed,
                                            "summary": summary, "cells": cells, "paired": paired})
        print(f"\nwrote {out.relative_to(ROOT)}")
    return 1 if failed else 0


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


if __name__ == "__main__":
    sys.exit(main())
