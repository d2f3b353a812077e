"""POST /v1/systemone as a lean ASGI route (the hot path): no framework, no database.

Checks run in SPEC §1's order: 401 -> 413/415 -> 400 -> 403 -> 404 -> 413 (text) -> 400 (capability).
"""

from __future__ import annotations

import logging

from app.api.asgi import Receive, Scope, Send, send_bytes, send_error
from app.api.public.intake import take
from app.decisions import jsonbody, schema
from app.decisions.forward import Forwarder
from app.errors import ArbiterError
from app.settings import Settings
from app.tenancy.keycache import KeyCache
from app.tenancy.touches import KeyTouches

log = logging.getLogger("arbiter.decisions")


class SystemOneRoute:
    def __init__(self, keys: KeyCache, forwarder: Forwarder, touches: KeyTouches,
                 settings: Settings) -> None:
        self.keys = keys
        self.forwarder = forwarder
        self.touches = touches
        self.max_body = settings.max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        intake = await take(scope, receive, send, self.keys, self.max_body)
        if intake is None:
            return
        try:
            body = jsonbody.loads(intake.raw)
            request = schema.validate(body)
            outcome = await self.forwarder.decide(intake.principal, body, request, len(intake.raw),
                                                  intake.forward_headers)
        except ArbiterError as error:
            await send_error(send, error)
            return
        except Exception:
            log.exception("unexpected error in a decision request")
            await send_error(send, ArbiterError("internal error; the request id is in X-Request-Id"))
            return
        await send_bytes(send, outcome.status, outcome.body, outcome.content_type)
        self.touches.touch(intake.principal.key_id)
