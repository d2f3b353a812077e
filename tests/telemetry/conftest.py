"""Fixtures of the telemetry tests: every log line of the process, captured as JSON."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from app.telemetry.logs import JsonFormatter


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """Every line logged while the test runs, DEBUG included, as JsonFormatter writes it."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    previous = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    yield stream
    root.removeHandler(handler)
    root.setLevel(previous)
