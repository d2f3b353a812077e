"""Helpers for reading streamed emulator answers (NDJSON, SSE) in tests."""

from __future__ import annotations

import time
from typing import Any

import httpx
import orjson


def ndjson(text: str) -> list[Any]:
    """The JSON values of an NDJSON body, one a line."""
    return [orjson.loads(line) for line in text.splitlines() if line.strip()]


def sse_data(text: str) -> list[str]:
    """The `data:` payloads of an SSE body, checking the `data: ...\\n\\n` framing."""
    assert text.endswith("\n\n"), text[-40:]
    events = text[:-2].split("\n\n")
    assert all(event.startswith("data: ") for event in events), events
    return [event[len("data: ") :] for event in events]


def timed_lines(
    client: httpx.Client, path: str, body: Any, **kw: Any
) -> tuple[httpx.Response, list[tuple[float, str]]]:
    """POST `body` and read the answer line by line, noting when each line arrived
    (seconds since the request was sent). Empty lines (SSE separators) are skipped."""
    started = time.monotonic()
    lines: list[tuple[float, str]] = []
    with client.stream("POST", path, json=body, **kw) as response:
        for line in response.iter_lines():
            if line:
                lines.append((time.monotonic() - started, line))
    return response, lines
