"""One access line for every request (not only decisions), never a secret in it, never a None;
and, with tracing on, the trace and span ids on every line a request writes."""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from app.telemetry.logs import shown_path
from tests.support import Gateway, Stack, decision
from tests.telemetry.capture import access_lines, json_lines
from tests.ui.conftest import ui_sign_in


def lines_of(stream: io.StringIO, request_id: str, count: int = 1, patience: float = 10.0) -> list[dict[str, Any]]:
    return access_lines(stream, count, lambda line: line.get("request_id") == request_id, patience)


def test_every_request_gets_exactly_one_access_line(stack: Stack, captured: io.StringIO) -> None:
    """The admin API, the web UI, /v1/models, an unknown path, a decision refused before its body
    is read (401): one line each, with what a platform team reads in an access log. A decision
    keeps its own line (operation, model, tokens), and gets no second one."""
    with stack.client() as client:
        models = client.get("/v1/models")
        answered = client.post("/v1/systemone", json=decision())
    with stack.client("admin") as admin:
        projects = admin.get("/admin/projects")
        unknown = admin.get("/admin/no-such-thing")
    with stack.client(None) as anonymous:
        refused = anonymous.post("/v1/systemone", json=decision())
    ui = ui_sign_in(stack.gateway.url, stack.admin_key)
    page = ui.get("/ui/services")
    ui.close()
    expected = [(models, "GET", "/v1/models", "/v1/models", 200),
                (projects, "GET", "/admin/projects", "/admin/projects", 200),
                (unknown, "GET", "/admin/no-such-thing", "unmatched", 404),
                (refused, "POST", "/v1/systemone", "/v1/systemone", 401),
                (page, "GET", "/ui/services", "/ui/services", 200)]
    for response, method, path, route, status in expected:
        assert response.status_code == status, (path, response.text)
        (line,) = lines_of(captured, response.headers["x-request-id"])
        assert line["level"] == "INFO"
        assert line["message"] == f"{method} {path} {status}"
        assert (line["method"], line["path"], line["route"], line["status"]) == (method, path, route, status)
        assert line["latency_ms"] >= 0 and line["client"] == "127.0.0.1"
    (decided,) = lines_of(captured, answered.headers["x-request-id"])
    assert decided["operation"] == "decision" and decided["input_tokens"] > 0 and "method" not in decided
    time.sleep(0.5)  # a second line for any of them would be written by now
    for response, *_ in expected:
        assert len(lines_of(captured, response.headers["x-request-id"], count=2, patience=0)) == 1


def test_health_checks_and_scrapes_log_at_debug_while_they_succeed(stack: Stack, captured: io.StringIO) -> None:
    """Probed every few seconds by Kubernetes and Prometheus: DEBUG lines (shown with
    ARBITER_LOG_LEVEL=DEBUG), but a failing one is INFO like any other request."""
    with stack.client("admin") as admin:
        health, ready, scrape = admin.get("/healthz"), admin.get("/readyz"), admin.get("/metrics")
    with stack.client(None) as anonymous:
        refused = anonymous.get("/metrics")
    assert (health.status_code, ready.status_code, scrape.status_code, refused.status_code) == (200, 200, 200, 401)
    levels = {response.url.path + str(response.status_code): lines_of(captured, response.headers["x-request-id"])[0]
              ["level"] for response in (health, ready, scrape, refused)}
    assert levels == {"/healthz200": "DEBUG", "/readyz200": "DEBUG", "/metrics200": "DEBUG", "/metrics401": "INFO"}


def test_access_lines_never_hold_a_key_a_cookie_or_a_query_string(stack: Stack, captured: io.StringIO) -> None:
    secret = "query-secret-0123456789"
    typed = stack.project_key  # pasted into a path by mistake
    with stack.client() as client:
        assert client.get("/v1/models", params={"api_key": secret}).status_code == 200
    with stack.client("admin") as admin:
        mistaken = admin.get(f"/admin/projects/{typed}")
    assert mistaken.status_code == 404
    ui = ui_sign_in(stack.gateway.url, stack.admin_key)
    cookies = [value for value in ui.cookies.values() if value]
    assert cookies and ui.get("/ui/projects").status_code == 200
    ui.close()
    (line,) = lines_of(captured, mistaken.headers["x-request-id"])
    assert line["path"] == "/admin/projects/arb_proj_***" and line["route"] == "/admin/projects/{name}"
    # The server's lines (the test's own HTTP client logs the URLs it asks for).
    text = "\n".join(str(line) for line in json_lines(captured) if not line["logger"].startswith(("httpx", "httpcore")))
    for leaked in (secret, typed, typed[len("arb_proj_"):], stack.admin_key, *cookies):
        assert leaked not in text


def test_no_access_line_shows_none(stack: Stack, captured: io.StringIO) -> None:
    """A field with no value prints `-` (a request with no model, no provider), a count with
    none is left out: never None, never null."""
    with stack.client() as client:
        client.post("/v1/systemone", json=decision("ghost"))
        client.post("/v1/systemone", content=b"{", headers={"Content-Type": "application/json"})
        client.get("/v1/models")
    with stack.client(None) as anonymous:
        anonymous.post("/v1/systemone", json=decision())
        anonymous.get("/v1/models")
    lines = access_lines(captured, 5)
    assert len(lines) == 5
    assert {line["status"] for line in lines} == {404, 400, 200, 401}
    for line in lines:
        assert "None" not in line["message"]
        assert all(value is not None and value != "None" for value in line.values()), line
    ghost = next(line for line in lines if line["status"] == 404)
    assert (ghost["provider"], ghost["model"]) == ("-", "_unknown") and "input_tokens" not in ghost


def test_a_long_path_is_cut_and_a_key_in_it_blanked() -> None:
    assert shown_path("/v1/models") == "/v1/models"
    assert shown_path("/a/arb_admin_" + "Z" * 43 + "/b") == "/a/arb_admin_***/b"
    assert shown_path("/" + "x" * 2000) == "/" + "x" * 511 + "..."


@pytest.fixture
def traced(stack: Stack, gateway_factory: Callable[..., Gateway]) -> tuple[Gateway, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return gateway_factory(tracer_provider=provider), exporter


def server_span(exporter: InMemorySpanExporter, count: int) -> ReadableSpan:
    """The latest server span, once ``count`` have ended (one ends just after its last byte)."""
    deadline = time.monotonic() + 10
    while True:
        found = [s for s in exporter.get_finished_spans() if s.kind == SpanKind.SERVER]
        if len(found) >= count or time.monotonic() > deadline:
            return found[-1]
        time.sleep(0.01)


def ids_of(span: ReadableSpan) -> tuple[str, str]:
    return format(span.context.trace_id, "032x"), format(span.context.span_id, "016x")


def test_with_tracing_on_every_line_of_a_request_carries_its_trace_and_span_ids(
        stack: Stack, traced: tuple[Gateway, InMemorySpanExporter], captured: io.StringIO,
        monkeypatch: pytest.MonkeyPatch) -> None:
    gateway, exporter = traced
    with gateway.client(stack.project_key) as client:
        answered = client.post("/v1/systemone", json=decision())
        decided = server_span(exporter, 1)
        listed = client.get("/v1/models")
        models = server_span(exporter, 2)

        def broken(*_args: Any, **_kwargs: Any) -> Any:
            raise RuntimeError("injected fault")

        monkeypatch.setattr(gateway.app.components.forwarder, "decide", broken)
        failed = client.post("/v1/systemone", json=decision())
        failing = server_span(exporter, 3)
    assert (answered.status_code, listed.status_code, failed.status_code) == (200, 200, 500)
    assert len({decided.context.trace_id, models.context.trace_id, failing.context.trace_id}) == 3
    for response, span in ((answered, decided), (listed, models), (failed, failing)):
        (line,) = lines_of(captured, response.headers["x-request-id"])
        assert (line["trace_id"], line["span_id"]) == ids_of(span), line
    error = next(line for line in json_lines(captured) if "injected fault" in line.get("exception", ""))
    assert (error["trace_id"], error["span_id"]) == ids_of(failing)
    assert error["request_id"] == failed.headers["x-request-id"]


def test_with_tracing_off_no_line_has_trace_ids(stack: Stack, captured: io.StringIO) -> None:
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"  # the caller's: passed on, not logged
    with stack.client() as client:
        assert client.post("/v1/systemone", json=decision(), headers={"traceparent": parent}).status_code == 200
        assert client.get("/v1/models", headers={"traceparent": parent}).status_code == 200
    lines = access_lines(captured, 2)
    assert len(lines) == 2
    assert not any("trace_id" in line or "span_id" in line for line in json_lines(captured))
