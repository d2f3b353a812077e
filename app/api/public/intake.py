"""The first steps of every lean public route: the key, then the body under its caps.

When either fails, the error is sent here (with ``Connection: close`` when the body
was not read) and the route gets None.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from app.api.asgi import Receive, Scope, Send, header_map, send_error
from app.decisions.body import ClientGone, check_length, content_encoding, read_body
from app.errors import ArbiterError
from app.telemetry.record import RequestRecord
from app.tenancy.keycache import KeyCache
from app.tenancy.principal import Principal

_HEADERS = frozenset({b"authorization", b"content-length", b"content-encoding", b"traceparent",
                      b"tracestate"})
_PROPAGATED = ("traceparent", "tracestate")
# Sends an error in a route's error shape: ``(send, error, close=...)``.
ErrorSender = Callable[..., Awaitable[None]]


@dataclass(slots=True)
class Intake:
    principal: Principal
    raw: bytes
    forward_headers: dict[str, str]  # what goes on to the backend: trace context, request id

    def record(self, scope: Scope, operation: str) -> RequestRecord:
        """The record of this request, for metrics, logs and usage."""
        principal = self.principal
        return RequestRecord(scope["state"]["request_id"], operation, scope["path"],
                             project_id=principal.project_id, project=principal.project_name,
                             key_id=principal.key_id)


async def take(scope: Scope, receive: Receive, send: Send, keys: KeyCache, max_body: int,
               send_error: ErrorSender = send_error) -> Intake | None:
    headers = header_map(scope, _HEADERS)
    try:
        principal = await keys.authenticate(headers.get("authorization"), "project")
        encoding = content_encoding(headers.get("content-encoding"))
        check_length(headers.get("content-length"), max_body)
    except ArbiterError as error:
        await send_error(send, error, close=True)  # the body is unread: do not parse it as a request
        return None
    try:
        raw = await read_body(receive, encoding, max_body)
    except ClientGone:
        return None
    except ArbiterError as error:
        await send_error(send, error, close=True)
        return None
    forward_headers = {name: headers[name] for name in _PROPAGATED if name in headers}
    forward_headers["X-Request-Id"] = scope["state"]["request_id"]
    return Intake(principal, raw, forward_headers)
