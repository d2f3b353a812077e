"""POST /v1/systemone as a lean ASGI route (the hot path): no framework, no database.

Checks run in SPEC §1's order: 401 -> 413/415 -> 400 -> 403 -> 404 -> 413 (text) -> 400 (capability).
"""

from __future__ import annotations

import logging

from app.api.asgi import Receive, Scope, Send, header_map, send_bytes, send_error
from app.decisions import jsonbody, schema
from app.decisions.body import ClientGone, check_length, content_encoding, read_body
from app.decisions.forward import Forwarder
from app.errors import ArbiterError
from app.settings import Settings
from app.tenancy.keycache import KeyCache
from app.tenancy.touches import KeyTouches

log = logging.getLogger("arbiter.decisions")

_HEADERS = frozenset({b"authorization", b"content-length", b"content-encoding", b"traceparent",
                      b"tracestate"})
_PROPAGATED = ("traceparent", "tracestate")


class SystemOneRoute:
    def __init__(self, keys: KeyCache, forwarder: Forwarder, touches: KeyTouches,
                 settings: Settings) -> None:
        self.keys = keys
        self.forwarder = forwarder
        self.touches = touches
        self.max_body = settings.max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = header_map(scope, _HEADERS)
        # Before the body is read: answer and close, so the unread body is not parsed as a request.
        try:
            principal = await self.keys.authenticate(headers.get("authorization"), "project")
            encoding = content_encoding(headers.get("content-encoding"))
            check_length(headers.get("content-length"), self.max_body)
        except ArbiterError as error:
            await send_error(send, error, close=True)
            return
        try:
            raw = await read_body(receive, encoding, self.max_body)
        except ClientGone:
            return
        except ArbiterError as error:
            await send_error(send, error, close=True)
            return
        forward_headers = {name: headers[name] for name in _PROPAGATED if name in headers}
        forward_headers["X-Request-Id"] = scope["state"]["request_id"]
        try:
            body = jsonbody.loads(raw)
            request = schema.validate(body)
            outcome = await self.forwarder.decide(principal, body, request, len(raw), forward_headers)
        except ArbiterError as error:
            await send_error(send, error)
            return
        except Exception:
            log.exception("unexpected error in a decision request")
            await send_error(send, ArbiterError("internal error; the request id is in X-Request-Id"))
            return
        await send_bytes(send, outcome.status, outcome.body, outcome.content_type)
        self.touches.touch(principal.key_id)
