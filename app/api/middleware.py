"""Pure ASGI middleware. The stack is assembled in ``build_stack``, so its order is visible."""

from __future__ import annotations

import re
import uuid

from app.api.asgi import ASGIApp, Message, Receive, Scope, Send

_SAFE_ID = re.compile(rb"^[A-Za-z0-9._:-]{1,64}$")


class RequestIdMiddleware:
    """Gives every request an id (the caller's X-Request-Id when it is sane) and echoes it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = None
        for name, value in scope["headers"]:
            if name == b"x-request-id" and _SAFE_ID.match(value):
                request_id = value.decode()
                break
        if request_id is None:
            request_id = uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        header = (b"x-request-id", request_id.encode())

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), header]
            await send(message)

        await self.app(scope, receive, send_with_id)


def build_stack(app: ASGIApp) -> ASGIApp:
    """Outermost first: request id."""
    return RequestIdMiddleware(app)
