"""Added latency at concurrency 1, paired: blocks of sequential requests to each target in turn.

    python bench/paired.py --target NAME URL BODY_FILE EXPECT_MODEL [--header NAME "H: v"]...
                           [--blocks 20] [--block-size 200] [--warmup 200]

bench/run.py's cells measure one target at a time (a few seconds each) and subtract two p50s
taken seconds apart; on a shared VM whose speed drifts by the minute, that difference moves by
0.05-0.2 ms from round to round. Here every target gets ``--block-size`` requests in turn,
``--blocks`` times, so each target's requests are spread over the same minutes and a drift
falls on all of them alike. The first target named is the floor the others are compared with.

The client is a plain socket per target: a request built once, ``sendall``, then reads to the
answer's Content-Length, and nothing else inside the timed span (aiohttp's client, which the
cells use, spends ~0.2 ms of CPU per request of its own). Each block starts on a fresh
keep-alive connection with one untimed request, so no server's idle timeout closes one under
the timing. Every answer is checked after its time is taken: status 200, its ``model``, the
answers in question order (load.py's check); a failed check ends the run.

Prints one JSON object: per target, n, p50, p90, p99 and mean (ms) and each block's median.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from load import check_answer, percentile  # bench/ is not a package when run

TIMEOUT = 30.0  # seconds a request may take before the run gives up on that server
_MAX_HEAD = 64 * 1024


class Target:
    def __init__(self, name: str, url: str, body: bytes, model: str, headers: list[str]) -> None:
        scheme, _, rest = url.partition("://")
        if scheme != "http":
            raise SystemExit(f"paired.py: {url}: only http:// URLs")
        hostport, _, path = rest.partition("/")
        host, _, port = hostport.rpartition(":")
        self.name = name
        self.address = (host, int(port))
        self.model = model
        self.questions = list(json.loads(body)["questions"])
        head = [f"POST /{path} HTTP/1.1", f"Host: {hostport}", "Content-Type: application/json",
                *headers, f"Content-Length: {len(body)}"]
        self.request = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
        self.sock: socket.socket | None = None

    def connect(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock = socket.create_connection(self.address, timeout=TIMEOUT)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def exchange(self) -> bytes:
        """Send the request and read the whole answer; what it returns is checked by ``check``."""
        sock = self.sock
        assert sock is not None
        sock.sendall(self.request)
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                raise RuntimeError(f"{self.name} closed the connection before answering whole")
            data += chunk
            end = data.find(b"\r\n\r\n")
            if end < 0:
                if len(data) > _MAX_HEAD:
                    raise RuntimeError(f"{self.name} sent a header section over {_MAX_HEAD} bytes")
                continue
            length = content_length(data[:end])
            while len(data) < end + 4 + length:
                chunk = sock.recv(65536)
                if not chunk:
                    raise RuntimeError(f"{self.name} closed the connection before answering whole")
                data += chunk
            return data

    def check(self, answer: bytes) -> None:
        end = answer.find(b"\r\n\r\n")
        status = answer[: answer.find(b"\r\n")]
        if not status.startswith(b"HTTP/1.1 200 "):
            raise RuntimeError(f"{self.name} answered {status.decode('latin-1')!r}: {answer[end + 4:][:300]!r}")
        problem = check_answer(answer[end + 4:], self.model, self.questions)
        if problem:
            raise RuntimeError(f"{self.name}: {problem}")


def content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
        if name.strip().lower() == b"transfer-encoding":
            raise RuntimeError("a chunked answer: paired.py reads Content-Length answers only")
    raise RuntimeError("an answer without Content-Length")


def measure(targets: list[Target], blocks: int, block_size: int, warmup: int) -> dict[str, Any]:
    for target in targets:
        target.connect()
        for _ in range(warmup):
            target.check(target.exchange())
    times: dict[str, list[float]] = {t.name: [] for t in targets}
    block_medians: dict[str, list[float]] = {t.name: [] for t in targets}
    perf = time.perf_counter
    for _ in range(blocks):
        for target in targets:
            target.connect()
            target.check(target.exchange())  # untimed: the new connection's first request
            block: list[float] = []
            for _ in range(block_size):
                start = perf()
                answer = target.exchange()
                block.append(perf() - start)
                target.check(answer)
            times[target.name].extend(block)
            block.sort()
            block_medians[target.name].append(percentile(block, 50) * 1000.0)
    for target in targets:
        if target.sock is not None:
            target.sock.close()
    result: dict[str, Any] = {}
    for name, values in times.items():
        values.sort()
        result[name] = {
            "n": len(values),
            "p50": percentile(values, 50) * 1000.0,
            "p90": percentile(values, 90) * 1000.0,
            "p99": percentile(values, 99) * 1000.0,
            "mean": sum(values) / len(values) * 1000.0,
            "block_p50": block_medians[name],
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", nargs=4, action="append", required=True,
                        metavar=("NAME", "URL", "BODY_FILE", "EXPECT_MODEL"))
    parser.add_argument("--header", nargs=2, action="append", default=[], metavar=("NAME", "HEADER"))
    parser.add_argument("--blocks", type=int, default=20)
    parser.add_argument("--block-size", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=200)
    args = parser.parse_args()
    headers: dict[str, list[str]] = {}
    for name, header in args.header:
        headers.setdefault(name, []).append(header)
    targets = [Target(name, url, Path(body).read_bytes(), model, headers.get(name, []))
               for name, url, body, model in args.target]
    try:
        result = measure(targets, args.blocks, args.block_size, args.warmup)
    except (OSError, RuntimeError) as exc:
        print(json.dumps({"fatal": f"{type(exc).__name__}: {exc}"}))
        sys.exit(1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
