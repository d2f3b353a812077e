"""Admin calls to backends (their version, their models, Ollama's /api/show and /api/delete): one
pooled httpx client, each call answered in full within a total deadline, its failures translated
into the BackendError tree with messages that never carry the credentials a URL may hold."""

from __future__ import annotations

import asyncio
import functools
import http.cookiejar
import ssl
from types import TracebackType
from typing import Any, Self
from urllib.parse import urlsplit, urlunsplit

import httpx

from infra_adapters.base import (
    BackendAuthRejected,
    BackendProtocolError,
    BackendTimeout,
    BackendUnreachable,
)

__all__ = ["AdminClient", "admin_tls", "shown_url"]


@functools.cache
def admin_tls() -> ssl.SSLContext:
    """The TLS context of admin calls, made once: httpx makes a new one for every client, and
    loading the system's certificates into it costs ~20 ms of CPU, more than the call itself
    (a service sync makes several calls; so does every admin action that reaches a backend).
    httpx's own default (certifi's bundle, or SSL_CERT_FILE / SSL_CERT_DIR when set, read once).
    A context is safe to share between threads and clients; httpcore sets the same ALPN list
    (HTTP/1.1) on it at every https connection, so no HTTP/2 client may share it."""
    return httpx.create_ssl_context()


def shown_url(url: str) -> str:
    """``url`` as messages show it: without the user and password it may carry
    (``http://user:secret@host`` -> ``http://host``), which httpx would send as Basic auth."""
    try:
        parts = urlsplit(url)
    except ValueError:  # unreadable (a bad IPv6 literal): drop whatever stands before an "@"
        scheme, sep, rest = url.rpartition("://")
        authority, slash, path = rest.partition("/")
        return f"{scheme}{sep}{authority.rpartition('@')[2]}{slash}{path}"
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


class AdminClient:
    """The admin calls' HTTP client: one pooled ``httpx.AsyncClient`` for every backend.

    Admin calls used to start a fresh event loop and open an unpooled client each, so every call
    paid a new connection (and, before ``admin_tls``, ~20 ms of certificates); a sync makes a
    handful of calls per backend every few minutes, an admin action one or two. One pool keeps
    their connections, and the one TLS context is loaded once for all of them.

    The client belongs to the event loop it is first used on (httpx's and anyio's pools are bound
    to it): one AdminClient per running loop. The app's Components make one for the app's loop,
    the CLI one per command; a backend given none makes a short-lived one per call
    (``HttpBackendBase._admin_request``). Its owner closes it (``aclose``) once its callers stopped.
    """

    def __init__(self, *, timeout: float = 10.0, connect_timeout: float = 5.0) -> None:
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"AdminClient(timeout={self.timeout:g}, connect_timeout={self.connect_timeout:g})"

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self._closed = True
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def request(self, method: str, url: str, *, payload: dict[str, Any] | None = None,
                      headers: dict[str, str] | None = None, timeout: float | None = None,
                      missing_ok: bool = False, base: str | None = None) -> Any:
        """One admin call, answered in full within ``timeout`` (the client's by default) or
        BackendTimeout: httpx's own timeouts are per read, and a backend trickling its answer
        would hold the call (and the admin's request, or a sync) for as long as it likes.

        The JSON answer; ``{}`` for an empty 200; None for a 404 when ``missing_ok``. ``base``
        names the backend in "cannot reach" (the backend's own URL; by default the scheme, host
        and port of ``url``); every message drops the user and password a URL may carry."""
        seconds = self.timeout if timeout is None else timeout
        shown = shown_url(url)
        try:
            async with asyncio.timeout(seconds):
                response = await self._pooled().request(
                    method, url, json=payload, headers=headers,
                    timeout=httpx.Timeout(seconds, connect=min(self.connect_timeout, seconds)))
        except (TimeoutError, httpx.TimeoutException) as exc:
            raise BackendTimeout(f"{shown} did not answer within {seconds:g}s") from exc
        except httpx.HTTPError as exc:
            raise BackendUnreachable(f"cannot reach {_named(url, base)}: {type(exc).__name__}") from exc
        return _answer(response, shown, missing_ok)

    def _pooled(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._closed:
            raise RuntimeError("this AdminClient is closed: its owner stopped; make a new one")
        if self._client is None:
            # Never follow a backend's redirect (httpx's default, said here so it stays): an admin
            # call would carry Arbiter's credential to a URL of the backend's choosing.
            # And keep no cookie: the client is every backend's, and a cookie is not bound to a port,
            # so one service's (a proxy's session, say) would go to the next service on its host,
            # and keep a service answering after its key was changed or removed.
            self._client = httpx.AsyncClient(verify=admin_tls(), follow_redirects=False, cookies=_no_cookies(),
                                             limits=httpx.Limits(max_connections=32, max_keepalive_connections=8))
            self._loop = loop
        elif loop is not self._loop:
            raise RuntimeError("an AdminClient serves the event loop it was first used on (its pool is bound "
                               "to it): make one AdminClient per running loop")
        return self._client


def _no_cookies() -> http.cookiejar.CookieJar:
    """A jar that takes no cookie from any answer."""
    return http.cookiejar.CookieJar(policy=http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))


def _named(url: str, base: str | None) -> str:
    if base is None:
        try:
            parts = urlsplit(url)
            base = urlunsplit((parts.scheme, parts.netloc, "", "", ""))
        except ValueError:
            base = url
    return shown_url(base.rstrip("/"))


def _answer(response: httpx.Response, shown: str, missing_ok: bool) -> Any:
    if response.status_code in (401, 403):
        raise BackendAuthRejected(f"{shown} refused Arbiter's credential (HTTP {response.status_code}); "
                                  "check the service's API key")
    if response.status_code == 404 and missing_ok:
        return None
    if response.status_code != 200:
        raise BackendProtocolError(f"{shown} answered HTTP {response.status_code}")
    if not response.content:
        return {}
    try:
        return response.json()
    except ValueError as exc:
        raise BackendProtocolError(f"{shown} answered something that is not JSON") from exc
