"""Logs: one JSON line per request, with its request id; never a key, a Bearer value or a state."""

from __future__ import annotations

import io
import json
import logging
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from app.telemetry.logs import JsonFormatter
from tests.support import Stack, decision


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
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


def access_lines(stream: io.StringIO, count: int = 1) -> list[dict[str, Any]]:
    """The access lines, once ``count`` are there (each is written just after its answer)."""
    deadline = time.monotonic() + 2
    while True:
        lines = [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]
        found = [line for line in lines if line["logger"] == "arbiter.access"]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.01)


def test_no_key_bearer_or_state_in_the_logs(stack: Stack, captured: io.StringIO, gateway_factory: Any) -> None:
    other = stack.new_project("globex")
    secret_state = "customer ssn 078-05-1120"
    keys = [stack.project_key, other, stack.admin_key, "arb_proj_" + "x" * 43, stack.project_key[:-2] + "zz"]
    for key in keys:
        with stack.gateway.client(key) as client:
            client.post("/v1/systemone", json=decision(state=secret_state))
            client.post("/v1/systemone", json=decision("ghost", state=secret_state))
            client.get("/v1/models")
            client.get("/admin/projects")
    stack.ollama_state.faults.non_json = True
    with stack.client() as client:
        client.post("/v1/systemone", json=decision(state=secret_state))
    text = captured.getvalue()
    assert text, "nothing was logged"
    for key in keys:
        assert key not in text
    # No Bearer value anywhere (the bare word appears in logged WWW-Authenticate headers).
    assert not re.search(r"Bearer\s+\S", text, re.IGNORECASE)
    assert "arb_proj_" not in text and "arb_admin_" not in text
    assert secret_state not in text


def test_one_access_line_per_request(stack: Stack, captured: io.StringIO) -> None:
    with stack.client() as client:
        ok = client.post("/v1/systemone", json=decision())
        missing = client.post("/v1/systemone", json=decision("ghost"))
    lines = access_lines(captured, 2)
    assert [line["request_id"] for line in lines] == [ok.headers["x-request-id"], missing.headers["x-request-id"]]
    first = lines[0]
    assert first["project"] == "acme" and first["model"] == "nimble" and first["status"] == 200
    assert first["input_tokens"] == ok.json()["usage"]["input_tokens"]
    assert first["latency_ms"] >= first["backend_ms"] > 0
    assert lines[1]["status"] == 404 and lines[1]["error_type"] == "not_found_error"


def test_payload_logging_puts_the_state_in(stack: Stack, captured: io.StringIO, gateway_factory: Any) -> None:
    verbose = gateway_factory(log_payloads=True)
    with verbose.client(stack.project_key) as client:
        assert client.post("/v1/systemone", json=decision(state={"ticket": "visible"})).status_code == 200
    assert access_lines(captured)[-1]["state"] == {"ticket": "visible"}
