"""Log lines captured as a gateway in this process writes them, read back as JSON."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from typing import Any


def json_lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]


def access_lines(stream: io.StringIO, count: int = 1,
                 where: Callable[[dict[str, Any]], bool] = lambda _line: True,
                 patience: float = 10.0) -> list[dict[str, Any]]:
    """The access lines ``where`` keeps, once ``count`` are there (each is written just after its
    answer), or what there is after ``patience`` seconds (generous: a loaded host; 0 to read what
    is there now)."""
    deadline = time.monotonic() + patience
    while True:
        found = [line for line in json_lines(stream) if line["logger"] == "arbiter.access" and where(line)]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.01)
