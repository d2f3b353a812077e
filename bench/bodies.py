"""Big bodies against the event loop: does one tenant's 30 MiB body freeze the process?

    .venv/bin/python bench/bodies.py [--mib 30] [--concurrent 3] [--shape objects|numbers] [--rounds 1]
    .venv/bin/python bench/bodies.py --case assets|assets-capped|zstd-multipart [--concurrent 4]

Starts the Ollama emulator and one `arbiter serve` the way bench/run.py does (a throw-away
SQLite deployment in a temp dir), then sends ``--concurrent`` bodies of ``--mib`` MiB at once,
each ``{"model", "questions", "state": [{}, {}, ...]}`` (tiny values: millions of them), while a
thread polls ``GET /healthz`` every ~10 ms on its own keep-alive connection and samples Arbiter's
resident memory. Prints each big request's status and time, the worst and median /healthz
latency while they were under way, and Arbiter's peak RSS growth over its idle RSS.
Goal (issue #19): /healthz under 50 ms at its worst, and under +200 MB.

Issue #30's cases, four at once by default (``--case``):
- ``assets``: a multipart body whose asset references are 30 of ``"a" * 1000 + "#i"`` and the
  SDK's ``<image:0>`` (no prefix common to all, which Python's regex compiler would factor out),
  and whose state is 30,000 a's (62 KB; a regex alternation of them took seconds of loop);
- ``assets-capped``: the same within the caps (63 references of 250 a's and a suffix, and one
  ``<image:0>``, a
  40,000-character state), so that it is scanned and forwarded, not refused;
- ``zstd-multipart``: ~1.2 KB of zstd holding a multipart body with a 31 MiB image part (under
  the 32 MiB cap decompressed, 41 MiB as base64).
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run  # bench/ is not a package when run

GOAL_HEALTHZ_MS = 50.0
GOAL_RSS_MB = 200.0
POLL_SECONDS = 0.01
QUESTIONS = b'{"urgent":{"type":"noul","instructions":"Reply within the hour?"}}'
SHAPES = {"objects": b"{}", "numbers": b"0"}


BOUNDARY = "b3nchb0undary"
FORM_TYPE = f"multipart/form-data; boundary={BOUNDARY}"


def form_part(name: str, content: bytes, content_type: str) -> bytes:
    return (f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n'
            f"Content-Type: {content_type}\r\n\r\n").encode() + content + b"\r\n"


def image_form(state: str, references: list[str], image: bytes | None) -> bytes:
    if image is None:
        assets = {r: {"type": "image", "data_base64": "iVBORw0KGgo="} for r in references}
    else:
        assets = {references[0]: {"type": "image", "part": "asset-0"}}
    request = {"model": "clef", "state": state, "assets": assets, "questions": json.loads(QUESTIONS)}
    parts = [form_part("request", json.dumps(request).encode(), "application/json")]
    if image is not None:
        parts.append(form_part("asset-0", image, "image/png"))
    return b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()


def case_body(case: str) -> tuple[bytes, dict[str, str]]:
    """The body of one of issue #30's cases, and its headers."""
    if case == "assets":
        references = ["a" * 1000 + f"#{i}" for i in range(30)] + ["<image:0>"]
        return image_form("a" * 30_000, references, None), {"Content-Type": FORM_TYPE}
    if case == "assets-capped":
        references = ["a" * 250 + f"#{i}" for i in range(63)] + ["<image:0>"]
        return image_form("a" * 40_000, references, None), {"Content-Type": FORM_TYPE}
    raw = image_form("Photo: <image:0>", ["<image:0>"], bytes(31 * 1024 * 1024))
    return zstandard.ZstdCompressor().compress(raw), {"Content-Type": FORM_TYPE, "Content-Encoding": "zstd"}


def big_body(mib: int, shape: str) -> bytes:
    head = b'{"model":"' + run.GATEWAY_MODEL.encode() + b'","questions":' + QUESTIONS + b',"state":['
    item = SHAPES[shape]
    count = (mib * 1024 * 1024 - len(head) - 2) // (len(item) + 1)
    return head + b",".join([item] * count) + b"]}"


class Watch(threading.Thread):
    """Polls /healthz and samples RSS until stopped; keeps every latency and the peak RSS."""

    def __init__(self, port: int, pid: int) -> None:
        super().__init__(daemon=True)
        self.port, self.pid = port, pid
        self.latencies: list[float] = []
        self.peak_rss = run.rss_mb(pid)
        self.stopping = threading.Event()

    def run(self) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        while not self.stopping.is_set():
            started = time.perf_counter()
            connection.request("GET", "/healthz")
            response = connection.getresponse()
            response.read()
            self.latencies.append(time.perf_counter() - started)
            self.peak_rss = max(self.peak_rss, run.rss_mb(self.pid))
            time.sleep(POLL_SECONDS)
        connection.close()


def send(port: int, key: str, body: bytes, results: list[tuple[int, float, bytes]],
         headers: dict[str, str] | None = None) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    started = time.perf_counter()
    connection.request("POST", "/v1/systemone", body=body,
                       headers={"Authorization": f"Bearer {key}",
                                **(headers or {"Content-Type": "application/json"})})
    response = connection.getresponse()
    answer = response.read()
    results.append((response.status, time.perf_counter() - started, answer[:160]))
    connection.close()


def one_round(cluster: run.Cluster, body: bytes, concurrent: int,
              headers: dict[str, str] | None = None) -> dict[str, Any]:
    pid = cluster.procs["arbiter"].pid
    idle_rss = run.rss_mb(pid)
    watch = Watch(cluster.arbiter_port, pid)
    watch.start()
    time.sleep(0.5)  # a few idle polls first: the connection is warm when the load starts
    idle_polls = len(watch.latencies)
    results: list[tuple[int, float, bytes]] = []
    senders = [threading.Thread(target=send, args=(cluster.arbiter_port, cluster.arbiter_key, body, results,
                                                   headers))
               for _ in range(concurrent)]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join()
    watch.stopping.set()
    watch.join()
    loaded = watch.latencies[idle_polls:] or [0.0]
    return {
        "requests": [{"status": s, "seconds": round(t, 3), "answer": a.decode(errors="replace")}
                     for s, t, a in results],
        "healthz_polls": len(loaded),
        "healthz_worst_ms": max(loaded) * 1000,
        "healthz_p50_ms": statistics.median(loaded) * 1000,
        "rss_idle_mb": idle_rss,
        "rss_peak_mb": watch.peak_rss,
        "rss_growth_mb": watch.peak_rss - idle_rss,
    }


def report(number: int, result: dict[str, Any]) -> bool:
    print(f"round {number}:")
    for request in result["requests"]:
        print(f"  POST /v1/systemone -> {request['status']} in {request['seconds']:.3f} s: {request['answer'][:100]}")
    ok = result["healthz_worst_ms"] < GOAL_HEALTHZ_MS and result["rss_growth_mb"] < GOAL_RSS_MB
    print(f"  /healthz while they ran: worst {result['healthz_worst_ms']:.1f} ms, "
          f"p50 {result['healthz_p50_ms']:.2f} ms ({result['healthz_polls']} polls; goal < {GOAL_HEALTHZ_MS:.0f} ms)")
    print(f"  arbiter RSS: idle {result['rss_idle_mb']:.0f} MB, peak {result['rss_peak_mb']:.0f} MB, "
          f"growth {result['rss_growth_mb']:+.0f} MB (goal < +{GOAL_RSS_MB:.0f} MB)   {'PASS' if ok else 'FAIL'}")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=30)
    parser.add_argument("--concurrent", type=int, default=None, help="3, or 4 with --case")
    parser.add_argument("--case", choices=("assets", "assets-capped", "zstd-multipart"), default=None,
                        help="one of issue #30's bodies instead of --mib of tiny values")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="objects")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    headers = None
    if args.case is None:
        concurrent = args.concurrent or 3
        body = big_body(args.mib, args.shape)
        print(f"body: {len(body)} bytes of {args.shape} (state: [{SHAPES[args.shape].decode()}, ...]), "
              f"{concurrent} at once, commit {run.git_commit()}")
    else:
        concurrent = args.concurrent or 4
        body, headers = case_body(args.case)
        print(f"body: {args.case}, {len(body)} bytes on the wire, {concurrent} at once, commit {run.git_commit()}")
    cluster = run.Cluster(Path(tempfile.mkdtemp(prefix="arbiter-bodies-")))
    passed = True
    try:
        cluster.cli("migrate")
        cluster.start("emulator", [str(run.ARBITER), "emulate", "ollama", "--port", str(cluster.emulator_port)])
        run.wait_http(cluster, f"http://127.0.0.1:{cluster.emulator_port}/api/version", "emulator")
        run.setup_arbiter(cluster)
        for number in range(1, args.rounds + 1):
            passed = report(number, one_round(cluster, body, concurrent, headers)) and passed
    finally:
        cluster.close()
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
