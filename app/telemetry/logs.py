"""Structured logs: one JSON object a line, with the request id; never a key or a state
unless payload logging is switched on."""

from __future__ import annotations

import datetime as dt
import logging
import sys
from typing import Any

import orjson

from app.telemetry.record import RequestRecord

access = logging.getLogger("arbiter.access")
_RESERVED = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname, "logger": record.name, "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def configure(level: str) -> None:
    """JSON lines on stderr for every logger (uvicorn's included)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True


def log_request(record: RequestRecord, state: Any = None) -> None:
    """The one line per decision or chat request. ``state`` is given only with payload logging on."""
    if not access.isEnabledFor(logging.INFO):
        return
    fields: dict[str, Any] = {
        "request_id": record.request_id, "operation": record.operation, "project": record.project,
        "model": record.model, "provider": record.provider, "status": record.status,
        "latency_ms": round(record.seconds * 1000, 3),
        "backend_ms": round(record.backend_seconds * 1000, 3),
        "input_tokens": record.input_tokens, "output_tokens": record.output_tokens,
    }
    if record.error_type:
        fields["error_type"] = record.error_type
    if record.metadata:
        fields["metadata"] = record.metadata
    if state is not None:
        fields["state"] = state
    access.info("%s %s %s", record.operation, record.model, record.status, extra=fields)
