"""Prometheus metrics (SPEC §6), on a registry of the app's own (a fresh app, fresh metrics).

Token usage follows the OpenTelemetry GenAI semantic conventions: one observation for the
input and one for the output tokens of every successful decision, on the entry node only.
The duration histogram carries what the conventions recommend on it besides: the backend's
``server_address`` and ``server_port`` and the ``gen_ai_response_model``. No metric has a
per-key label, and every label value comes from what an admin configured (a service's URL, a
model's name, a project's name), never from what a caller sent.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)

from app.telemetry.loop_metrics import LoopCounter, LoopHistogram
from app.telemetry.record import RequestRecord
from app.telemetry.service_up import ServiceUp
from app.telemetry.tracing import server_attributes

TOKEN_BUCKETS = tuple(float(4**n) for n in range(14))  # 1, 4, 16, ..., 67108864
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
FSYNC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
# The duration histogram's server_address, server_port and gen_ai_response_model of a request
# that reached no backend (a 404, a 400, a rate limit): empty, which Prometheus reads as absent.
NO_BACKEND = ("", "", "")


class Metrics:
    def __init__(self, *, project_label: bool = True) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._project_label = project_label
        # The process's own (CPU, memory, open files; the interpreter; its collector), on this
        # registry: each app has its own, so several in one process (tests) never clash.
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        project = ["project"] if project_label else []
        token_labels = ["gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_token_type",
                        "gen_ai_request_model", *project]
        # Written on every request: lock-free series (loop_metrics.py); the rest are prometheus_client's.
        self.token_usage = LoopHistogram(
            "gen_ai_client_token_usage", "Tokens used per request (input and output), OTel GenAI.",
            token_labels, buckets=TOKEN_BUCKETS, registry=self.registry)
        self.operation_duration = LoopHistogram(
            "gen_ai_client_operation_duration_seconds", "Duration of GenAI operations through the gateway.",
            ["gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model", "error_type",
             "server_address", "server_port", "gen_ai_response_model", *project],
            buckets=DURATION_BUCKETS, registry=self.registry)
        # Requests that named a model by an alias: the series above count them under the target
        # (the model that did the work); this says which alias they came by. One series per alias
        # an admin made, never per name a caller sent.
        self.alias_requests = LoopCounter(
            "arbiter_alias_requests", "Decision and chat requests that named a model by an alias.",
            ["gen_ai_operation_name", "alias", "gen_ai_request_model"], registry=self.registry)
        # Answered decisions whose reading clearly failed (app/routing/strategies/answer_warnings.py):
        # one per warning, by the codes Arbiter writes only.
        self.decision_warnings = LoopCounter(
            "arbiter_decision_warnings", "Warnings on answered decisions (a reading that clearly failed), by code.",
            ["gen_ai_request_model", "code"], registry=self.registry)
        self.requests = LoopCounter("arbiter_http_requests", "HTTP requests by route and status.",
                                ["route", "method", "status"], registry=self.registry)
        self.in_flight = Gauge("arbiter_http_requests_in_flight", "HTTP requests being served.",
                               ["route"], registry=self.registry)
        self.shed = Counter("arbiter_shed", "Requests refused with 503 at the concurrency cap.",
                            registry=self.registry)
        # Set by the HTTP server (app/server.py): the gauge reads its set of connections at scrape time.
        self.connections_open = Gauge("arbiter_connections_open", "Client connections open on the HTTP server.",
                                      registry=self.registry)
        self.connections_refused = Counter("arbiter_connections_refused",
                                           "Client connections refused with 503 at ARBITER_MAX_CONNECTIONS.",
                                           registry=self.registry)
        self.connections_idle_closed = Counter(
            "arbiter_connections_idle_closed", "Idle client connections closed at ARBITER_MAX_CONNECTIONS "
            "to make room for new ones.", registry=self.registry)
        self.rate_limited = Counter("arbiter_rate_limited", "Requests refused with 429 by a rate limit.",
                                    registry=self.registry)
        self.redis_up = Gauge("arbiter_redis_up", "1 when the shared rate-limit store (Redis) answers, "
                              "0 when it does not (absent without Redis).", registry=self.registry)
        self.rate_limit_fallback = Gauge(
            "arbiter_rate_limit_fallback", "1 while this replica counts its share of each rate limit in memory "
            "(Redis unreachable, ARBITER_RATE_LIMIT_FALLBACK=share), 0 while limits are shared (absent without "
            "Redis).", registry=self.registry)
        self.rate_limit_replicas = Gauge(
            "arbiter_rate_limit_replicas", "Replicas counted live (heartbeats in the database): the divisor of "
            "each limit while Redis is unreachable (absent without Redis).", registry=self.registry)
        self.usage_dropped = Counter("arbiter_usage_records_dropped",
                                     "Usage records given up: unstorable, over the buffer's limit during a "
                                     "database outage, or left at a shutdown the database never came back for.",
                                     registry=self.registry)
        self.usage_pending = Gauge("arbiter_usage_pending", "Usage records buffered, not yet in the database.",
                                   registry=self.registry)
        self.usage_write_errors = Counter(
            "arbiter_usage_write_errors", "Batch writes of usage records that failed (the database away) "
            "and will be retried.", registry=self.registry)
        self.usage_spool_records = Gauge(
            "arbiter_usage_spool_records", "Usage records waiting in spool files in ARBITER_USAGE_SPOOL_DIR, "
            "as this replica sees it: kept by a shutdown and not loaded yet, or not loadable (*.loading).",
            registry=self.registry)
        self.usage_spool_bytes = Gauge(
            "arbiter_usage_spool_bytes", "Bytes of every usage spool file in ARBITER_USAGE_SPOOL_DIR (journals "
            "of running replicas included), as this replica last saw them: what the spool volume holds.",
            registry=self.registry)
        self.usage_journal_records = Gauge(
            "arbiter_usage_journal_records", "This replica's usage records on disk in the spool (its journal, "
            "files it loaded) that are not in the database yet.", registry=self.registry)
        self.usage_spool_fsync = Histogram(
            "arbiter_usage_spool_fsync_seconds", "Time of one write and fsync of the usage journal.",
            buckets=FSYNC_BUCKETS, registry=self.registry)
        self.usage_spool_write_errors = Counter(
            "arbiter_usage_spool_write_errors", "Writes of the usage spool that failed (a full volume: "
            "ENOSPC); the records wait in memory and are tried again.", registry=self.registry)
        self.usage_partitions = Gauge(
            "arbiter_usage_partitions", "Day partitions of the usage ledger at the last usage maintenance run "
            "on this replica (PostgreSQL; 0 until this replica holds the maintenance lease).",
            registry=self.registry)
        self.usage_retention_deleted = Counter(
            "arbiter_usage_retention_deleted", "Usage records deleted past ARBITER_USAGE_RETENTION_DAYS one by "
            "one (SQLite, PostgreSQL's default partition); a day partition dropped whole is not counted here.",
            registry=self.registry)
        # Read at scrape time from what the registry last read of the services (components.py).
        self.service_up = ServiceUp(registry=self.registry)
        self.overhead = LoopHistogram(
            "arbiter_gateway_overhead_seconds",
            "Time a request spent in the gateway itself (total minus waiting on the backend).",
            ["gen_ai_operation_name"], buckets=OVERHEAD_BUCKETS, registry=self.registry)

    def observe(self, record: RequestRecord) -> None:
        """A finished decision or chat request (the HTTP counters are the middleware's)."""
        if record.model is None or record.status == 0:
            return
        provider = record.provider or "none"
        if record.alias is not None:
            self.alias_requests.labels(record.operation, record.alias, record.model).inc()
        project = (record.project or "",) if self._project_label else ()
        self.operation_duration.labels(record.operation, provider, record.model, record.error_type or "",
                                       *(record.served_by or NO_BACKEND), *project).observe(record.seconds)
        if record.backend_seconds:
            self.overhead.labels(record.operation).observe(record.overhead_seconds)
        if record.status != 200 or record.forwarded:  # counted once, on the entry node
            return
        for code in record.warnings:
            self.decision_warnings.labels(record.model, code).inc()
        if record.input_tokens is None:
            return
        self.token_usage.labels(record.operation, provider, "input", record.model, *project).observe(
            record.input_tokens)
        if record.output_tokens is not None:
            self.token_usage.labels(record.operation, provider, "output", record.model, *project).observe(
                record.output_tokens)


def backend_labels(url: str, backend_name: str) -> tuple[tuple[str, str, str], tuple[str, str, str]]:
    """The duration histogram's (server_address, server_port, gen_ai_response_model) for a replica
    at ``url`` serving ``backend_name``: once with the model (the backend answered: the model that
    did the work, by the backend's own name for it), once without (it failed to answer: no response,
    no response model). The host and port of the URL only, as the spans have them: never its
    path, query or credentials."""
    server = server_attributes(url)
    address, port = str(server.get("server.address", "")), str(server.get("server.port", ""))
    return (address, port, backend_name), (address, port, "")
