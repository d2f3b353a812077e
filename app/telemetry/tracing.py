"""OpenTelemetry tracing (SPEC §6): off unless the standard OTEL_* variables ask for it.

- a server span per request (the ASGI middleware of opentelemetry-instrumentation-asgi, the
  piece FastAPI's instrumentation is made of, so the lean routes get spans too);
- a client span ``decision <model>`` per backend call, with ``gen_ai.*`` attributes (the
  response model among them: the backend's name of the model that answered), ``server.address``
  and ``server.port``;
- ``gen_ai.usage.input_tokens`` / ``output_tokens`` and ``body.state`` on both;
- the client span's ``traceparent`` / ``tracestate`` go to the backend.
When tracing is off nothing here runs on the hot path, and the caller's own trace headers
are forwarded as they came.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.propagate import inject
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider

from app import jsonbody


def enabled_by_environment(env: Mapping[str, str] = os.environ) -> bool:
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def provider_from_environment() -> TracerProvider | None:
    """An SDK provider exporting over OTLP/HTTP, configured by OTEL_*; None when tracing is off."""
    if not enabled_by_environment():
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = SdkTracerProvider(resource=Resource.create({"service.name": os.environ.get(
        "OTEL_SERVICE_NAME", "arbiter")}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


class Tracing:
    """The app's tracer, or nothing. One per app: tests pass their own provider."""

    def __init__(self, provider: TracerProvider | None, *, state: bool, state_max_bytes: int) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("arbiter") if provider is not None else None
        self._state = state
        self._state_max = state_max_bytes

    @property
    def on(self) -> bool:
        return self.tracer is not None

    def state_text(self, body: Any) -> str | None:
        if not self._state or not isinstance(body, dict):
            return None
        if "state" in body:
            state = body["state"]
        elif "input" in body:  # an OpenAI decision: its input is the state
            state = body["input"]
        else:
            return None
        text = state if isinstance(state, str) else jsonbody.dumps(state).decode()
        encoded = text.encode()
        if len(encoded) > self._state_max:
            text = encoded[: self._state_max].decode("utf-8", "ignore")
        return text

    @contextlib.contextmanager
    def client_span(self, operation: str, model: str, provider: str, url: str,
                    headers: dict[str, str]) -> Iterator[Span | None]:
        """A CLIENT span around one backend call to ``url``; ``headers`` get its trace context."""
        if self.tracer is None:
            yield None
            return
        attributes: dict[str, str | int] = {"gen_ai.operation.name": operation, "gen_ai.provider.name": provider,
                                            "gen_ai.request.model": model, **server_attributes(url)}
        with self.tracer.start_as_current_span(f"{operation} {model}", kind=SpanKind.CLIENT,
                                               attributes=attributes, record_exception=False,
                                               set_status_on_exception=False) as span:
            inject(headers)  # this span's traceparent/tracestate replace the caller's
            yield span


    def open_client_span(self, operation: str, model: str, provider: str, url: str,
                         headers: dict[str, str]) -> Span | None:
        """A CLIENT span for a call whose answer outlives the caller's frame (a streamed chat),
        child of the current span; ``headers`` get its trace context. The caller ends it."""
        if self.tracer is None:
            return None
        attributes: dict[str, str | int] = {"gen_ai.operation.name": operation, "gen_ai.provider.name": provider,
                                            "gen_ai.request.model": model, **server_attributes(url)}
        span = self.tracer.start_span(f"{operation} {model}", kind=SpanKind.CLIENT, attributes=attributes,
                                      record_exception=False, set_status_on_exception=False)
        inject(headers, context=trace.set_span_in_context(span))  # replaces the caller's traceparent
        return span


@functools.lru_cache(maxsize=256)
def server_attributes(url: str) -> Mapping[str, str | int]:
    """``server.address`` (the host name or IP) and ``server.port`` of a backend's URL, as the
    OpenTelemetry conventions have them; none for a backend that is no server (a model file)."""
    parts = urlsplit(url)
    if not parts.hostname or parts.scheme not in ("http", "https"):
        return {}
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:  # a port out of range: the address alone
        return {"server.address": parts.hostname}
    return {"server.address": parts.hostname, "server.port": port}


def annotate(span: Span | None, *, input_tokens: int | None = None, output_tokens: int | None = None,
             state: str | None = None, error_type: str | None = None, status: int | None = None,
             response_model: str | None = None) -> None:
    """Usage, state and outcome on a span (the server span or a client span). ``response_model``
    is the backend's name of the model that answered (``gen_ai.response.model``: a client span's)."""
    if span is None or not span.is_recording():
        return
    if response_model is not None:
        span.set_attribute("gen_ai.response.model", response_model)
    if input_tokens is not None:
        span.set_attribute("gen_ai.usage.input_tokens", input_tokens)
    if output_tokens is not None:
        span.set_attribute("gen_ai.usage.output_tokens", output_tokens)
    if state is not None:
        span.set_attribute("body.state", state)
    if error_type is not None:
        span.set_attribute("error.type", error_type)
        span.set_status(Status(StatusCode.ERROR, error_type))
    elif status is not None and status >= 400:
        span.set_attribute("error.type", str(status))
        span.set_status(Status(StatusCode.ERROR, str(status)))


def current_span() -> Span:
    return trace.get_current_span()
