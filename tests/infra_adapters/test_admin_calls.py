"""Admin calls to a backend (its version, its models): one pooled client (infra_adapters/admin.py)
that keeps its connections and its one TLS context, answers each call in full within its deadline,
and says what went wrong without the credentials a URL may carry."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web

from infra_adapters.admin import AdminClient, admin_tls
from infra_adapters.base import BackendAuthRejected, BackendProtocolError, BackendTimeout, BackendUnreachable
from infra_adapters.emulators.ollama import OllamaState, make_ollama_app
from infra_adapters.emulators.server import EmulatorServer
from infra_adapters.ollama import OllamaBackend
from tests.support import free_port

USER, PASSWORD = "alice-admin", "s3cret-pw"


def _peers(app: web.Application) -> list[tuple[str, int]]:
    """The client address (host, port) of every request ``app`` serves: one per connection."""
    seen: list[tuple[str, int]] = []

    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        assert request.transport is not None
        seen.append(request.transport.get_extra_info("peername")[:2])
        return await handler(request)

    app.middlewares.append(record)
    return seen


async def _trickle(request: web.Request) -> web.StreamResponse:
    """An answer that never stops coming: a byte every 0.2 s for 10 s (each read is quick)."""
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    await response.prepare(request)
    for _ in range(50):
        await response.write(b" ")
        await asyncio.sleep(0.2)
    await response.write(b"{}")
    return response


FOLLOWED = web.AppKey("followed", list)


def _answers() -> web.Application:
    app = web.Application()
    app[FOLLOWED] = []

    def answer(status: int = 200, body: bytes = b"", content_type: str = "application/json",
               **headers: str) -> Any:
        async def handle(request: web.Request) -> web.Response:
            return web.Response(status=status, body=body, content_type=content_type, headers=headers)

        return handle

    async def target(request: web.Request) -> web.Response:
        request.app[FOLLOWED].append(request.path)
        return web.json_response({"followed": True})

    app.router.add_get("/refused", answer(401, b'{"error": "unauthorized"}'))
    app.router.add_get("/forbidden", answer(403, b'{"error": "forbidden"}'))
    app.router.add_get("/missing", answer(404, b'{"error": "not found"}'))
    app.router.add_get("/broken", answer(500, b'{"error": "boom"}'))
    app.router.add_get("/text", answer(body=b"<html>oops</html>", content_type="text/html"))
    app.router.add_get("/empty", answer())
    app.router.add_get("/json", answer(body=b'{"version": "1.2.3"}'))
    app.router.add_get("/moved", answer(302, Location="/target"))
    app.router.add_get("/target", target)
    app.router.add_get("/trickle", _trickle)
    return app


@pytest.fixture(scope="module")
def answers() -> Iterator[EmulatorServer]:
    with EmulatorServer(_answers()) as server:
        yield server


def _call(url: str, *, timeout: float | None = None, missing_ok: bool = False) -> Any:
    async def call() -> Any:
        async with AdminClient(timeout=5.0) as admin:
            return await admin.request("GET", url, timeout=timeout, missing_ok=missing_ok)

    return asyncio.run(call())


def test_admin_calls_load_the_certificates_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """httpx makes a TLS context for every client it opens (~20 ms of CPU for the system's
    certificates), whether or not the URL is https; a sync makes several calls, every replica
    every few minutes, so they share one (a backend without an AdminClient makes a client per call)."""
    admin_tls()
    loads: list[str] = []
    for name in ("load_verify_locations", "load_default_certs"):  # a CA file or directory; the system's
        original = getattr(ssl.SSLContext, name)

        def counted(self: ssl.SSLContext, *args: Any, _name: str = name, _original: Any = original,
                    **kwargs: Any) -> Any:
            loads.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(ssl.SSLContext, name, counted)

    async def calls(url: str) -> None:
        async with AdminClient() as admin:
            for backend in (OllamaBackend(url), OllamaBackend(url, admin=admin)):
                for _ in range(3):
                    assert await backend.read_version()
                    assert await backend.list_models()

    with EmulatorServer(make_ollama_app(OllamaState())) as server:
        asyncio.run(calls(server.url))
    assert loads == []


def test_the_shared_context_still_checks_certificates_and_names() -> None:
    context = admin_tls()
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname


def test_one_admin_client_makes_its_calls_over_one_connection() -> None:
    """The pool keeps the connection between calls; a backend built without one (a test, a tool)
    opens a connection per call, on a client that lives for that call only."""
    app = make_ollama_app(OllamaState())
    peers = _peers(app)

    async def pooled(url: str) -> None:
        async with AdminClient() as admin:
            backend = OllamaBackend(url, admin=admin)
            for _ in range(3):
                assert await backend.read_version() == "0.35.0"
                assert await backend.capabilities("nimble") == {"decision"}

    async def unpooled(url: str) -> None:
        backend = OllamaBackend(url)
        for _ in range(3):
            assert await backend.read_version() == "0.35.0"

    with EmulatorServer(app) as server:
        asyncio.run(pooled(server.url))
        assert len(peers) == 6 and len(set(peers)) == 1, peers
        peers.clear()
        asyncio.run(unpooled(server.url))
        assert len(peers) == 3 and len(set(peers)) == 3, peers


def test_a_trickling_backend_meets_the_whole_call_s_deadline(answers: EmulatorServer) -> None:
    """httpx's timeouts are per read: a byte every 0.2 s would hold a 1 s call for 10 s. The
    backend's own admin timeout holds on the shared client too (which waits 10 s by default)."""
    started = time.monotonic()
    with pytest.raises(BackendTimeout) as caught:
        _call(answers.url + "/trickle", timeout=1.0)
    assert 0.9 <= time.monotonic() - started < 3.0
    assert str(caught.value) == f"{answers.url}/trickle did not answer within 1s"

    async def through_a_backend() -> None:
        async with AdminClient(timeout=10.0) as admin:
            backend = OllamaBackend(answers.url, admin=admin, admin_timeout=1.0)
            await backend._admin_get("/trickle")

    started = time.monotonic()
    with pytest.raises(BackendTimeout, match="did not answer within 1s"):
        asyncio.run(through_a_backend())
    assert time.monotonic() - started < 3.0


def test_answers_are_translated_into_the_backend_errors(answers: EmulatorServer) -> None:
    url = answers.url
    assert _call(url + "/json") == {"version": "1.2.3"}
    assert _call(url + "/empty") == {}
    assert _call(url + "/missing", missing_ok=True) is None
    for path, status in (("/refused", 401), ("/forbidden", 403)):
        with pytest.raises(BackendAuthRejected) as refused:
            _call(url + path, missing_ok=True)  # a refusal, never "missing"
        assert str(refused.value) == (f"{url}{path} refused Arbiter's credential (HTTP {status}); "
                                      "check the service's API key")
    for path, message in (("/missing", "answered HTTP 404"), ("/broken", "answered HTTP 500"),
                          ("/text", "answered something that is not JSON")):
        with pytest.raises(BackendProtocolError) as failed:
            _call(url + path)
        assert str(failed.value) == f"{url}{path} {message}" and not isinstance(failed.value, BackendAuthRejected)


def test_a_redirect_is_not_followed(answers: EmulatorServer) -> None:
    """It would take Arbiter's credential to a URL of the backend's choosing."""
    with pytest.raises(BackendProtocolError, match="answered HTTP 302"):
        _call(answers.url + "/moved")
    assert answers.app[FOLLOWED] == []


def test_no_cookie_goes_from_one_backend_to_another() -> None:
    """The client is every backend's, and a cookie is not bound to a port: one service's (a
    proxy's session) would go along to the next service on the host, or keep a service answering
    after its key was removed."""
    seen: list[str | None] = []

    async def sets(request: web.Request) -> web.Response:
        return web.json_response({}, headers={"Set-Cookie": "session=abc; Path=/"})

    async def reads(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Cookie"))
        return web.json_response({})

    first, second = web.Application(), web.Application()
    first.router.add_get("/login", sets)
    second.router.add_get("/version", reads)
    first.router.add_get("/version", reads)

    async def walk(a: str, b: str) -> None:
        async with AdminClient() as admin:
            await admin.request("GET", a + "/login")
            await admin.request("GET", b + "/version")
            await admin.request("GET", a + "/version")

    with EmulatorServer(first) as a, EmulatorServer(second) as b:
        asyncio.run(walk(a.url, b.url))
    assert seen == [None, None]


def test_no_message_carries_the_credentials_of_the_url(answers: EmulatorServer) -> None:
    """httpx sends a URL's user and password as Basic auth; the messages (shown to admins, logged,
    stored as a service's last error) name the backend without them."""
    secret_url = answers.url.replace("http://", f"http://{USER}:{PASSWORD}@")
    messages = []
    for path, error in (("/refused", BackendAuthRejected), ("/broken", BackendProtocolError),
                        ("/text", BackendProtocolError), ("/trickle", BackendTimeout)):
        with pytest.raises(error) as caught:
            _call(secret_url + path, timeout=0.5)
        messages.append(str(caught.value))
    down = f"http://{USER}:{PASSWORD}@127.0.0.1:{free_port()}"
    with pytest.raises(BackendUnreachable) as unreachable:
        asyncio.run(OllamaBackend(down).read_version())
    messages.append(str(unreachable.value))
    assert messages[-1] == f"cannot reach {down.replace(f'{USER}:{PASSWORD}@', '')}: ConnectError"
    for message in messages:
        assert PASSWORD not in message and USER not in message, message
    assert all("127.0.0.1:" in message for message in messages), messages


def test_an_admin_client_serves_one_event_loop(answers: EmulatorServer) -> None:
    """Its pool is bound to the loop of its first call: another loop is told so, not left to hang
    or fail deep inside anyio; a closed client says it is closed."""
    admin = AdminClient()

    async def call() -> Any:
        return await admin.request("GET", answers.url + "/json")

    first = asyncio.new_event_loop()
    try:
        assert first.run_until_complete(call()) == {"version": "1.2.3"}
        with pytest.raises(RuntimeError, match="one AdminClient per running loop"):
            asyncio.run(call())
        first.run_until_complete(admin.aclose())
    finally:
        first.close()
    with pytest.raises(RuntimeError, match="is closed"):
        asyncio.run(call())


def test_a_cancelled_call_is_given_up_and_the_pool_serves_the_next(answers: EmulatorServer) -> None:
    """Stopping is cancelling (a shutdown cancels the sync's task): the call under way ends at once,
    and its half-read connection is not handed to the next call."""

    async def cancel_then_call() -> Any:
        async with AdminClient(timeout=30.0) as admin:
            stuck = asyncio.create_task(admin.request("GET", answers.url + "/trickle"))
            await asyncio.sleep(0.5)
            started = time.monotonic()
            stuck.cancel()
            with pytest.raises(asyncio.CancelledError):
                await stuck
            assert time.monotonic() - started < 1.0
            return await admin.request("GET", answers.url + "/json")

    assert asyncio.run(cancel_then_call()) == {"version": "1.2.3"}
