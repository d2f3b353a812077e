"""Logs: one JSON line per request, with its request id; never a key, a Bearer value or a state."""

from __future__ import annotations

import io
import json
import logging
import re
import time
from typing import Any

import pytest

from app.telemetry import usage
from app.telemetry.logs import BatchingHandler, JsonFormatter
from tests.support import Stack, decision
from tests.telemetry import capture
from tests.ui.conftest import ui_sign_in


def access_lines(stream: io.StringIO, count: int = 1) -> list[dict[str, Any]]:
    """The decisions' and chats' access lines (not the other requests': test_access_log.py)."""
    return capture.access_lines(stream, count, lambda line: "operation" in line)


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


def test_a_request_that_names_no_model_logs_a_dash_for_it(stack: Stack, captured: io.StringIO) -> None:
    """A body that is not JSON, or JSON without a model: `-`, never `None`; nor for the project
    and the provider, and the tokens of a request that has none are left out, not null."""
    with stack.client() as client:
        garbled = client.post("/v1/systemone", content=b"not json", headers={"Content-Type": "application/json"})
        nameless = client.post("/v1/systemone", json={"state": "x", "questions": {}})
    lines = access_lines(captured, 2)
    assert [line["status"] for line in lines] == [garbled.status_code, nameless.status_code] == [400, 400]
    assert [line["model"] for line in lines] == ["-", "-"]
    assert [line["message"] for line in lines] == ["decision - 400"] * 2
    assert [(line["project"], line["provider"]) for line in lines] == [("acme", "-")] * 2
    assert not any("input_tokens" in line or "output_tokens" in line for line in lines)
    assert not any(value is None or value == "None" for line in lines for value in line.values())


def _broken(*_args: Any, **_kwargs: Any) -> Any:
    raise RuntimeError("injected fault")


@pytest.mark.parametrize("where", ["decision", "admin API", "web UI"])
def test_an_unexpected_errors_line_carries_the_request_id_the_caller_got(
        stack: Stack, captured: io.StringIO, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """Every 500 says "the request id is in X-Request-Id" (the UI: "in the server's logs"):
    the logged exception must carry that id, on the lean decision route as on FastAPI's."""
    if where == "decision":
        monkeypatch.setattr(stack.gateway.app.components.forwarder, "decide", _broken)
        client = stack.client()
        answer = client.post("/v1/systemone", json=decision())
    else:
        monkeypatch.setattr(usage, "summary", _broken)  # the admin API's usage reads it
        monkeypatch.setattr(usage, "recent", _broken)  # the web UI's usage page, its latest requests
        client = stack.client("admin") if where == "admin API" else ui_sign_in(stack.gateway.url, stack.admin_key)
        answer = client.get("/admin/usage" if where == "admin API" else "/ui/usage")
    client.close()
    assert answer.status_code == 500
    request_id = answer.headers["x-request-id"]
    if where == "web UI":
        assert request_id in answer.text  # the page shows the id to look up
    errors = [json.loads(line) for line in captured.getvalue().splitlines()
              if "injected fault" in json.loads(line).get("exception", "")]
    assert errors, captured.getvalue()
    assert {line["request_id"] for line in errors} == {request_id}


def test_a_batched_line_keeps_the_request_id_it_was_logged_with(monkeypatch: pytest.MonkeyPatch) -> None:
    """BatchingHandler writes from a thread of its own, where no request is being served: the id
    is the one of the request that logged the line, taken when it was logged."""
    import contextvars
    import threading

    from app.telemetry import logs

    stream = io.StringIO()
    handler = BatchingHandler(stream, interval=60)  # written only by the flush below
    handler.setFormatter(JsonFormatter())
    monkeypatch.setattr(logging.getLogger(), "handlers", [handler])
    monkeypatch.setattr(logging.getLogger(), "level", logging.INFO)

    def serve(request_id: str) -> None:
        logs.request_id.set(request_id)
        logging.getLogger("arbiter.decisions").error("backend gone")

    for request_id in ("rid-a", "rid-b"):
        contextvars.copy_context().run(serve, request_id)
    logging.getLogger("arbiter.decisions").error("between requests")
    writer = threading.Thread(target=handler.close)  # not the thread, nor the context, that logged
    writer.start()
    writer.join()
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [line.get("request_id") for line in lines] == ["rid-a", "rid-b", None]


def test_payload_logging_puts_the_state_in(stack: Stack, captured: io.StringIO, gateway_factory: Any) -> None:
    verbose = gateway_factory(log_payloads=True)
    with verbose.client(stack.project_key) as client:
        assert client.post("/v1/systemone", json=decision(state={"ticket": "visible"})).status_code == 200
    assert access_lines(captured)[-1]["state"] == {"ticket": "visible"}


def test_serve_s_log_set_up_writes_the_same_access_line_batched(monkeypatch: pytest.MonkeyPatch) -> None:
    """`arbiter serve` logs through one BatchingHandler: access lines take a short cut past the
    logging machinery there, and must come out as JsonFormatter writes them; anything else
    (another handler, a filter) takes the usual way."""
    from app.telemetry.logs import BatchingHandler, _sole_handler, log_request
    from app.telemetry.record import RequestRecord

    record = RequestRecord("rid-1", "decision", "/v1/systemone", model="nimble", project="acme", provider="ollama",
                           status=200, seconds=0.0123, backend_seconds=0.01, input_tokens=7, output_tokens=2,
                           error_type=None, metadata={"safety_identifier": "u1"})
    lines = []
    for extra_filter in (False, True):
        stream = io.StringIO()
        handler = BatchingHandler(stream, interval=60)  # written only by the flush below
        handler.setFormatter(JsonFormatter())
        if extra_filter:
            handler.addFilter(lambda _record: True)
        monkeypatch.setattr(logging.getLogger(), "handlers", [handler])
        monkeypatch.setattr(logging.getLogger(), "level", logging.INFO)
        assert _sole_handler() is (None if extra_filter else handler)  # the short cut, or not
        log_request(record, state={"ticket": 1})
        assert stream.getvalue() == ""  # batched
        handler.close()  # writes what is held, stops its thread
        lines.append(json.loads(stream.getvalue()))
    fast, usual = lines
    assert fast.pop("time")[:4] == usual.pop("time")[:4] == time.strftime("%Y", time.gmtime())
    assert list(fast.items()) == list(usual.items())  # same fields, same order
    assert fast["message"] == "decision nimble 200" and fast["state"] == {"ticket": 1}


def test_every_line_is_written_though_uvicorn_reconfigures_logging_and_the_process_exits() -> None:
    """uvicorn's dictConfig closes and forgets every handler at start-up; lines logged after it,
    up to the last one before the process exits, still reach stderr."""
    import subprocess
    import sys

    script = (
        "import logging, logging.config\n"
        "from uvicorn.config import LOGGING_CONFIG\n"
        "from app.telemetry.logs import configure\n"
        "configure('INFO')\n"
        "log = logging.getLogger('arbiter.access')\n"
        "log.info('before')\n"
        "logging.config.dictConfig(LOGGING_CONFIG)\n"
        "for i in range(2000):\n"
        "    log.info('after %d', i)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    messages = [json.loads(line)["message"] for line in done.stderr.splitlines() if line.startswith("{")]
    assert messages == ["before"] + [f"after {i}" for i in range(2000)]


def test_admin_calls_to_backends_are_not_logged_request_by_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """httpx logs each request it sends at INFO, with the whole URL: every admin call to every
    backend would make a line (and a URL's query or user part would be in it)."""
    from app.telemetry.logs import configure

    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)
    monkeypatch.setattr(logging.getLogger("httpx"), "level", logging.getLogger("httpx").level)
    configure("INFO")
    assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)
    assert logging.getLogger("httpx").isEnabledFor(logging.WARNING)
    configure("ERROR")
    assert not logging.getLogger("httpx").isEnabledFor(logging.WARNING)
