"""Structured logs: one JSON object a line, with the request id (and, when tracing is on, the
trace and span ids); never a key or a state unless payload logging is switched on. One access
line per request: a decision's or a chat's (``log_request``, from its record), or any other
HTTP request's (``log_http``, from the middleware)."""

from __future__ import annotations

import atexit
import contextvars
import datetime as dt
import logging
import re
import sys
import threading
import time
import weakref
from typing import Any

import orjson
from opentelemetry.trace import get_current_span

from app.telemetry.record import RequestRecord

access = logging.getLogger("arbiter.access")
MISSING = "-"  # an access line's text field that has no value (never None, never null)
NO_MODEL = MISSING  # an access line's model when the request named none (a body that is not JSON)
# Scraped and probed every few seconds: their access lines are DEBUG while they succeed.
PROBE_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
MAX_LOGGED_PATH = 512  # characters of a request's path an access line shows
# A key typed into a path by mistake (a 404): its secret part never reaches a line.
_KEY_IN_PATH = re.compile(r"(arb_(?:proj|admin)_)[A-Za-z0-9]+")
_RESERVED = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}

# The id of the HTTP request being served, set once per request by RequestMiddleware (one
# ContextVar.set, measured 0.1-0.5 µs: all the hot path pays) and read only when a line is
# formatted. The server runs every request in a task of its own, so the value goes with it.
request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("arbiter_request_id", default=None)


class JsonFormatter(logging.Formatter):
    """One JSON object: time, level, logger, message, the request id (a field given with the
    line wins over the served request's), any other extra fields, the exception.

    It reads the request id where it runs: in the thread and task that logged the line, since
    handlers format in ``emit`` (BatchingHandler's thread only writes lines already formatted)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname, "logger": record.name, "message": record.getMessage(),
        }
        served = request_id.get()
        if served is not None:
            entry["request_id"] = served
        traced = current_trace_ids()
        if traced is not None:
            entry["trace_id"], entry["span_id"] = traced
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


class BatchingHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A StreamHandler that writes the lines of the last ``interval`` seconds in one write, from a
    thread of its own, instead of one write (a system call) per line on the event loop.

    A line waits at most ``interval``; ``flush()`` writes everything at once, and so does the
    exit of the process; past ``MAX_PENDING`` lines the caller writes them itself, so a stream
    that blocks slows the logger down as before instead of filling memory. Like a StreamHandler,
    it keeps working after ``close()``: uvicorn's logging.config.dictConfig closes every handler
    there is at start-up (and forgets them, so logging's own flush at exit would not see it)."""

    MAX_PENDING = 10_000

    def __init__(self, stream: Any, interval: float = 0.05) -> None:
        super().__init__(stream)
        self._pending: list[str] = []
        self._pending_lock = threading.Lock()  # emit() and the swap in flush()
        self._write_lock = threading.Lock()  # one writer at a time, lines in order
        ref = weakref.ref(self)  # the thread and the exit hook do not keep a dropped handler alive
        threading.Thread(target=_write_batches, args=(ref, interval), name="arbiter-log-writer",
                         daemon=True).start()
        atexit.register(_flush_at_exit, ref)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + self.terminator
        except Exception:  # noqa: BLE001 - logging's own contract: report, never raise
            self.handleError(record)
            return
        self.append(line)

    def append(self, line: str) -> None:
        """A formatted line (with its terminator) to write with the next batch."""
        with self._pending_lock:
            self._pending.append(line)
            full = len(self._pending) >= self.MAX_PENDING
        if full:
            self.flush()

    def flush(self) -> None:
        with self._write_lock:
            with self._pending_lock:
                lines, self._pending = self._pending, []
            stream = self.stream
            if stream is None:
                return
            try:
                if lines:
                    stream.write("".join(lines))
                if hasattr(stream, "flush"):
                    stream.flush()
            except (OSError, ValueError):  # stderr closed or gone: nowhere left to say so
                self.dropped += len(lines)

    dropped = 0

    def close(self) -> None:
        self.flush()
        super().close()


def _write_batches(ref: weakref.ReferenceType[BatchingHandler], interval: float) -> None:
    while True:
        time.sleep(interval)
        handler = ref()
        if handler is None:
            return
        handler.flush()
        del handler


def _flush_at_exit(ref: weakref.ReferenceType[BatchingHandler]) -> None:
    handler = ref()
    if handler is not None:
        handler.flush()


def configure(level: str) -> None:
    """JSON lines on stderr for every logger (uvicorn's included)."""
    handler = BatchingHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    # httpx logs every request it sends at INFO ("HTTP Request: GET <url> ..."): each admin call to
    # a backend, every few minutes per service, with the whole URL. Its warnings still show.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, root.level))


def current_trace_ids() -> tuple[str, str] | None:
    """The (trace_id, span_id) of the span being served, as W3C's traceparent spells them (32 and
    16 hex digits), or None outside a span (tracing off: there never is one)."""
    context = get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return format(context.trace_id, "032x"), format(context.span_id, "016x")


def log_request(record: RequestRecord, state: Any = None) -> None:
    """The one line per decision or chat request. ``state`` is given only with payload logging on.
    A text field with no value is ``-``; a count with none (the tokens of a failure) is left out."""
    if not access.isEnabledFor(logging.INFO):
        return
    model = record.model or NO_MODEL
    fields: dict[str, Any] = {
        "request_id": record.request_id, "operation": record.operation, "project": record.project or MISSING,
        "model": model, "provider": record.provider or MISSING, "status": record.status,
        "latency_ms": round(record.seconds * 1000, 3),
        "backend_ms": round(record.backend_seconds * 1000, 3),
    }
    if record.input_tokens is not None:
        fields["input_tokens"] = record.input_tokens
    if record.output_tokens is not None:
        fields["output_tokens"] = record.output_tokens
    if record.error_type:
        fields["error_type"] = record.error_type
    if record.metadata:
        fields["metadata"] = record.metadata
    if state is not None:
        fields["state"] = state
    if record.trace_ids is not None:  # taken while the request was served (observer.py)
        fields["trace_id"], fields["span_id"] = record.trace_ids
    _write(logging.INFO, f"{record.operation} {model} {record.status}", fields, record.at, "log_request")


def log_http(request_id: str, method: str, path: str, route: str, status: int, seconds: float,
             client: str | None, trace_ids: tuple[str, str] | None) -> None:
    """The one line of an HTTP request that is no decision or chat (those have ``log_request``'s):
    the admin API, the web UI, /v1/models, a refusal before a body was read (a 401). The path
    without its query string (never logged: it is the caller's, and may hold anything) and with
    a key's secret part blanked; health checks and scrapes at DEBUG while they succeed."""
    level = logging.DEBUG if status < 400 and path in PROBE_PATHS else logging.INFO
    if not access.isEnabledFor(level):
        return
    shown = shown_path(path)
    fields: dict[str, Any] = {"request_id": request_id, "method": method, "path": shown, "route": route,
                              "status": status, "latency_ms": round(seconds * 1000, 3),
                              "client": client or MISSING}
    if trace_ids is not None:
        fields["trace_id"], fields["span_id"] = trace_ids
    _write(level, f"{method} {shown} {status}", fields, None, "log_http")


def shown_path(path: str) -> str:
    """``path`` as an access line shows it: a key's secret part blanked, at most MAX_LOGGED_PATH."""
    if "arb_" in path:
        path = _KEY_IN_PATH.sub(r"\1***", path)
    return path if len(path) <= MAX_LOGGED_PATH else path[:MAX_LOGGED_PATH] + "..."


def _write(level: int, message: str, fields: dict[str, Any], at: dt.datetime | None, where: str) -> None:
    """An access line: ``fields`` as extra fields, written at ``at`` (when its request ended)."""
    handler = _sole_handler(level)
    if handler is not None:
        # `arbiter serve`'s own set-up (configure): the line JsonFormatter would write, without
        # a LogRecord and the walk through the logging machinery (about half of its cost).
        when = at or dt.datetime.now(dt.UTC)  # when the request ended: its line may be written later
        entry = {"time": when.isoformat(timespec="milliseconds"), "level": logging.getLevelName(level),
                 "logger": access.name, "message": message, **fields}
        handler.append(orjson.dumps(entry, default=str).decode() + handler.terminator)
        return
    # Logger.info() would also walk the stack for the caller's file and line (findCaller), which
    # no line shows: the record is made directly and goes through the same handlers and filters.
    # The message is whole already (no arguments): a path's own "%" is never a format.
    line = access.makeRecord(access.name, level, __file__, 0, message, (), None, where, fields)
    if at is not None:
        line.created = at.timestamp()
        line.msecs = (line.created - int(line.created)) * 1000
    access.handle(line)


def _sole_handler(level: int = logging.INFO) -> BatchingHandler | None:
    """The handler a line at ``level`` of the access logger reaches, when it is the only one, ours,
    JSON, and nothing on the way filters (any other set-up, tests' included, goes through logging
    as usual)."""
    found = None
    logger: logging.Logger | None = access
    while logger is not None:
        if logger.filters:
            return None
        for handler in logger.handlers:
            if (found is not None or type(handler) is not BatchingHandler or handler.filters
                    or type(handler.formatter) is not JsonFormatter or handler.level > level):
                return None
            found = handler
        if not logger.propagate:
            break
        logger = logger.parent
    return found
