"""Failed admin keys, throttled per client address (app/tenancy/throttle.py) on the routes that
take one: /admin/... and /metrics. Pure ASGI, inside the proxy-headers layer, so the address
is the peer's, or X-Forwarded-For's from a proxy of ARBITER_FORWARDED_ALLOW_IPS. The decision
and chat routes never pass through here."""

from __future__ import annotations

from app.api.asgi import ASGIApp, Message, Receive, Scope, Send, send_error
from app.errors import RateLimited
from app.tenancy.throttle import FailureThrottle, client_key, retry_message

GUARDED = ("/admin/", "/metrics")


def client_of(scope: Scope) -> str:
    client = scope.get("client")
    return client_key(client[0] if client else None)


class FailedKeyThrottle:
    """An address past its failures gets 429 before its key is looked up; a 401 to a request
    that sent a credential counts one failure (a request without one is no guess)."""

    def __init__(self, app: ASGIApp, throttle: FailureThrottle) -> None:
        self.app = app
        self.throttle = throttle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.throttle.on or not scope["path"].startswith(GUARDED):
            await self.app(scope, receive, send)
            return
        client = client_of(scope)
        wait = await self.throttle.retry_after(client)
        if wait:
            await send_error(send, RateLimited(retry_message(wait), headers={"Retry-After": str(wait)}),
                             close=True)
            return
        status = 0

        async def watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        await self.app(scope, receive, watch)
        if status == 401 and any(name == b"authorization" for name, _ in scope["headers"]):
            await self.throttle.failed(client)
