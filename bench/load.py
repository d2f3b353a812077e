"""Closed-loop HTTP load generator for the Arbiter benchmark (run in its own process).

    python bench/load.py --url URL --body-file BODY.json [--header "Name: value"]...
                         --requests N --concurrency C [--warmup W] [--handshake]

`C` workers share one aiohttp session whose connection pool holds exactly `C`
keep-alive connections; each worker sends the same pre-encoded body, waits for
the whole answer, and immediately sends the next one. A warm-up phase (untimed,
its answers checked for shape) opens the connections and warms both servers,
then `N` timed requests follow. One JSON object is printed on stdout at the end.

With `--handshake` the generator prints `{"event": "warm"}` on stdout after the
warm-up and waits for a line on stdin before the timed phase, so the caller
can sample the servers' CPU counters exactly around the timed requests.

Latency is `time.perf_counter()` around one request (send + full response
read). A response is an error unless its status is 200; errors and exceptions
are counted by kind and left out of the latency figures. The generator's own
CPU time (`resource.getrusage`) over the timed phase is reported so a reader
can check it was not the bottleneck (one Python process saturates at ~1 CPU
second per wall second).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import resource
import sys
import time
from collections import Counter
from typing import Any

import aiohttp


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]) of an already sorted list."""
    if not sorted_values:
        return math.nan
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def parse_headers(raw: list[str]) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    for item in raw:
        name, sep, value = item.partition(":")
        if not sep:
            raise SystemExit(f"load.py: bad --header {item!r} (want 'Name: value')")
        headers[name.strip()] = value.strip()
    return headers


def check_answer(raw: bytes, model: str, questions: list[str]) -> str | None:
    """Why a 200 answer is not a decision for our request, or None if it is."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return "200 with a body that is not JSON"
    if not isinstance(doc, dict):
        return "200 with a JSON body that is not an object"
    if doc.get("model") != model:
        return f"model is {doc.get('model')!r}, expected {model!r}"
    answers = doc.get("answers")
    if not isinstance(answers, dict) or list(answers) != questions:
        got = list(answers) if isinstance(answers, dict) else answers
        return f"answers {got!r} do not match the questions {questions!r}"
    return None


async def one(session: aiohttp.ClientSession, url: str, body: bytes,
              headers: dict[str, str]) -> tuple[int | str, bytes]:
    try:
        async with session.post(url, data=body, headers=headers) as response:
            return response.status, await response.read()
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - every failure is counted, none is fatal
        return type(exc).__name__, b""


async def run_phase(session: aiohttp.ClientSession, url: str, body: bytes,
                    headers: dict[str, str], total: int, concurrency: int,
                    on_answer: Any = None) -> tuple[list[float], Counter[str], float]:
    """`total` requests over `concurrency` closed-loop workers.

    Returns (latencies of 200s in completion order, error counts by kind, wall seconds).
    """
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    issued = 0
    perf = time.perf_counter

    async def worker() -> None:
        nonlocal issued
        while issued < total:
            issued += 1
            start = perf()
            status, raw = await one(session, url, body, headers)
            end = perf()
            if status == 200:
                latencies.append(end - start)
                if on_answer is not None:
                    problem = on_answer(raw)
                    if problem:
                        errors[f"bad answer: {problem}"] += 1
            else:
                errors[str(status)] += 1
                if isinstance(status, int) and len(errors) <= 5:
                    print(f"load.py: HTTP {status}: {raw[:300]!r}", file=sys.stderr)

    started = perf()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, total))))
    return latencies, errors, perf() - started


def summarize(latencies: list[float], errors: Counter[str],
              wall: float, requests: int) -> dict[str, Any]:
    ordered = sorted(latencies)
    ms = 1000.0
    summary: dict[str, Any] = {
        "requests": requests,
        "ok": len(latencies),
        "errors": sum(errors.values()),
        "error_kinds": dict(errors),
        "wall_s": wall,
        "throughput_rps": requests / wall if wall > 0 else math.nan,
        "latency_ms": {
            "min": ordered[0] * ms if ordered else math.nan,
            "mean": (sum(ordered) / len(ordered)) * ms if ordered else math.nan,
            "stdev": _stdev(ordered) * ms,
            "p50": percentile(ordered, 50) * ms,
            "p90": percentile(ordered, 90) * ms,
            "p99": percentile(ordered, 99) * ms,
            "p99.9": percentile(ordered, 99.9) * ms,
            "max": ordered[-1] * ms if ordered else math.nan,
        },
    }
    # p50 of each tenth of the run (by completion order): drift or a stall shows here.
    slices = 10
    if len(latencies) >= slices * 10:
        size = len(latencies) // slices
        summary["p50_by_tenth_ms"] = [
            percentile(sorted(latencies[i * size:(i + 1) * size]), 50) * ms for i in range(slices)
        ]
    return summary


def _stdev(values: list[float]) -> float:
    if len(values) < 2:
        return math.nan
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


async def main_async(args: argparse.Namespace, body: bytes) -> dict[str, Any]:
    request = json.loads(body)
    model, questions = args.expect_model or request["model"], list(request["questions"])
    headers = parse_headers(args.header)
    concurrency = args.concurrency
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency,
                                     keepalive_timeout=60, force_close=False)
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout,
                                     skip_auto_headers=("User-Agent",)) as session:
        # Warm-up: opens the `concurrency` connections and checks every answer's shape.
        warmup = max(args.warmup, 2 * concurrency)
        _, warm_errors, _ = await run_phase(
            session, args.url, body, headers, warmup, concurrency,
            on_answer=lambda raw: check_answer(raw, model, questions))
        if warm_errors:
            return {"fatal": "errors during warm-up", "error_kinds": dict(warm_errors)}

        if args.handshake:
            print(json.dumps({"event": "warm"}), flush=True)
            if not sys.stdin.readline():
                return {"fatal": "stdin closed before the go signal"}

        gc.collect()
        gc.freeze()
        cpu_before = cpu_seconds()
        latencies, errors, wall = await run_phase(
            session, args.url, body, headers, args.requests, concurrency)
        cpu_used = cpu_seconds() - cpu_before

    result = summarize(latencies, errors, wall, args.requests)
    result.update({
        "url": args.url,
        "model": model,
        "concurrency": concurrency,
        "warmup_requests": warmup,
        "body_bytes": len(body),
        "event_loop": type(asyncio.get_running_loop()).__module__,
        "loadgen_cpu_s": cpu_used,
        "loadgen_cpu_ms_per_request": cpu_used * 1000.0 / args.requests,
        "loadgen_cpu_utilization": cpu_used / wall if wall > 0 else math.nan,
    })
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--body-file", required=True, help="the JSON request body to POST")
    parser.add_argument("--header", action="append", default=[], help="'Name: value' (repeatable)")
    parser.add_argument("--requests", type=int, default=1000, help="timed requests")
    parser.add_argument("--concurrency", type=int, default=1, help="closed-loop workers")
    parser.add_argument("--warmup", type=int, default=200,
                        help="untimed requests first (at least 2 x concurrency)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per request")
    parser.add_argument("--handshake", action="store_true",
                        help="print a 'warm' event after warm-up and wait for a stdin line")
    parser.add_argument("--no-uvloop", action="store_true", help="use asyncio's default loop")
    parser.add_argument("--expect-model", default=None,
                        help="the `model` the answers must carry (default: the request's model)")
    args = parser.parse_args()
    if args.requests < 1 or args.concurrency < 1:
        parser.error("--requests and --concurrency must be at least 1")

    runner: Any = asyncio.run
    if not args.no_uvloop:
        try:
            import uvloop

            runner = uvloop.run
        except ImportError:
            pass
    with open(args.body_file, "rb") as handle:
        body = handle.read()
    result = runner(main_async(args, body))
    print(json.dumps(result), flush=True)
    return 1 if "fatal" in result else 0


if __name__ == "__main__":
    sys.exit(main())
