"""HTTP plumbing shared by the adapters: a pooled aiohttp session for forwarding,
httpx for admin calls (each within a total deadline); transport errors translated into the BackendError tree."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import ssl
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any, TypeVar

import aiohttp
import httpx
import orjson

from infra_adapters.base import (
    AdminCallAbandoned,
    BackendAuthRejected,
    BackendBroken,
    BackendProtocolError,
    BackendTimeout,
    BackendUnreachable,
    CallOptions,
    Reply,
    ReplyTooLarge,
    Stream,
)
from infra_adapters.h1 import H1Pool

T = TypeVar("T")

__all__ = ["AiohttpStream", "HttpBackendBase", "translate_errors"]


class HttpBackendBase:
    """Holds the URL, the credential and the pools of one backend."""

    kind = "http"
    # Whether ``_post`` must send through ``open`` (a subclass that signs what ``open`` sends, as
    # the mesh does) rather than the lean client. None: whenever ``open`` is overridden.
    _post_through_open: bool | None = None

    def __init__(self, url: str, *, credential: str | None = None, connect_timeout: float = 5.0,
                 admin_timeout: float = 10.0, pool_size: int = 256) -> None:
        self.url = url.rstrip("/")
        self._credential = credential
        self._connect_timeout = connect_timeout
        self._admin_timeout = admin_timeout
        self._pool_size = pool_size
        self._session: aiohttp.ClientSession | None = None
        self._pool: H1Pool | None = None
        # What every forwarded POST carries, in order (``_headers`` adds the request's own).
        self._fixed_headers: tuple[tuple[str, str], ...] = (
            ("Content-Type", "application/json"), ("Accept", "*/*"), ("Accept-Encoding", "identity"),
            ("User-Agent", "arbiter"), *((("Authorization", f"Bearer {credential}"),) if credential else ()))
        self._timeouts: dict[tuple[float, bool], aiohttp.ClientTimeout] = {}

    @property
    def has_credential(self) -> bool:
        return bool(self._credential)

    def rejected_own_credential(self, answer: Reply | Stream) -> bool:
        return answer.status in (401, 403) and self.has_credential

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={self.url!r}, credential={'***' if self._credential else None})"

    # -- admin calls (sync, httpx) -------------------------------------------------

    def _admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._credential}"} if self._credential else {}

    def _admin_get(self, path: str) -> Any:
        return self._admin_request("GET", path)

    def _admin_post(self, path: str, payload: dict[str, Any]) -> Any:
        return self._admin_request("POST", path, payload)

    def _admin_request(self, method: str, path: str, payload: dict[str, Any] | None = None, *,
                       missing_ok: bool = False) -> Any:
        """One admin call, answered in full within ``admin_timeout`` or BackendTimeout. httpx's own
        timeouts are per read: a backend trickling its answer would hold the call (and the admin's
        request) for as long as it likes. Called from worker threads (a thread that runs an event loop
        of its own, as a test driving a browser does, has the call made on another)."""
        calls = admin_calls.get()
        exchange = self._admin_exchange(method, self.url + path, payload)
        try:
            response = _run(exchange if calls is None else calls.run(exchange))
        except (TimeoutError, httpx.TimeoutException) as exc:
            raise BackendTimeout(f"{self.url}{path} did not answer within {self._admin_timeout:g}s") from exc
        except httpx.HTTPError as exc:
            raise BackendUnreachable(f"cannot reach {self.url}: {type(exc).__name__}") from exc
        if response.status_code in (401, 403):
            raise BackendAuthRejected(
                f"{self.url}{path} refused Arbiter's credential (HTTP {response.status_code}); "
                "check the service's API key")
        if response.status_code == 404 and missing_ok:
            return None
        if response.status_code != 200:
            raise BackendProtocolError(f"{self.url}{path} answered HTTP {response.status_code}")
        if not response.content:
            return {}
        try:
            return response.json()
        except ValueError as exc:
            raise BackendProtocolError(f"{self.url}{path} answered something that is not JSON") from exc

    async def _admin_exchange(self, method: str, url: str, payload: dict[str, Any] | None) -> httpx.Response:
        timeout = httpx.Timeout(self._admin_timeout, connect=min(self._connect_timeout, self._admin_timeout))
        async with (asyncio.timeout(self._admin_timeout),
                    httpx.AsyncClient(timeout=timeout, verify=admin_tls()) as client):
            return await client.request(method, url, json=payload, headers=self._admin_headers())

    # -- forwarding (async, aiohttp) -----------------------------------------------

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self._pool_size, limit_per_host=self._pool_size,
                                             ttl_dns_cache=300, enable_cleanup_closed=True)
            self._session = aiohttp.ClientSession(connector=connector, auto_decompress=True,
                                                  skip_auto_headers=("User-Agent",))
        return self._session

    def _timeout(self, seconds: float, streaming: bool = False) -> aiohttp.ClientTimeout:
        timeout = self._timeouts.get((seconds, streaming))
        if timeout is None:
            connect = min(self._connect_timeout, seconds)
            timeout = (aiohttp.ClientTimeout(total=None, connect=connect, sock_read=seconds) if streaming
                       else aiohttp.ClientTimeout(total=seconds, connect=connect))
            self._timeouts[(seconds, streaming)] = timeout
        return timeout

    def _headers(self, options: CallOptions) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept-Encoding": "identity",
                   "User-Agent": "arbiter", **options.headers}
        if self._credential:
            headers["Authorization"] = f"Bearer {self._credential}"
        return headers

    async def _post(self, path: str, body: dict[str, Any], options: CallOptions) -> Reply:
        """POST and read the whole answer: through the lean client (infra_adapters/h1.py), unless a
        subclass shapes what ``open`` sends (the mesh signs it), which then keeps that path."""
        through_open = self._post_through_open
        if through_open is None:
            through_open = type(self).open is not HttpBackendBase.open
        if through_open:
            stream = await self.open(path, body, options)
            try:
                return Reply(stream.status, stream.content_type, await stream.read(options.max_reply_bytes),
                             stream.retry_after, stream.credential_refused)
            finally:
                await stream.close()
        pool = self._pool
        if pool is None:
            pool = self._pool = H1Pool(self.url, connect_timeout=self._connect_timeout, limit=self._pool_size)
        head = pool.head(path, self._fixed_headers)
        return await pool.post(path, head, options.headers, orjson.dumps(body), options.timeout,
                               options.max_reply_bytes)

    async def open(self, path: str, body: dict[str, Any], options: CallOptions) -> AiohttpStream:
        """POST and return as soon as the answer's head has arrived."""
        return await self._open(path, orjson.dumps(body), self._headers(options), options)

    async def _open(self, path: str, data: bytes, headers: dict[str, str], options: CallOptions) -> AiohttpStream:
        url = self.url + path
        with translate_errors(url, options.timeout):
            # Never follow a backend's redirect: it would re-send a tenant's body to a URL of the
            # backend's choosing (a server-side request forgery). A 3xx passes through as it came.
            response = await self._client().post(url, data=data, headers=headers,
                                                 timeout=self._timeout(options.timeout, options.streaming),
                                                 allow_redirects=False)
        return AiohttpStream(url, response, options.timeout)

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None
        if self._pool is not None:
            self._pool.close()
        self._pool = None


@functools.cache
def admin_tls() -> ssl.SSLContext:
    """The TLS context of admin calls, made once: httpx makes a new one for every client, and
    loading the system's certificates into it costs ~20 ms of CPU, more than the call itself
    (a service sync makes several calls; so does every admin action that reaches a backend).
    httpx's own default (certifi's bundle, or SSL_CERT_FILE / SSL_CERT_DIR when set, read once).
    A context is safe to share between threads and clients; httpcore sets the same ALPN list
    (HTTP/1.1) on it at every https connection, so no HTTP/2 client may share it."""
    return httpx.create_ssl_context()


class AdminCalls:
    """The admin calls of one owner (a service sync), so that its stop can give up the one under
    way instead of waiting out its timeout: the calls are made with ``admin_calls`` set to it, each
    on an event loop of its own in a worker thread, and ``abandon`` cancels them there (they raise
    AdminCallAbandoned), and every call made after it at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]]] = set()
        self._abandoned = False

    @property
    def abandoned(self) -> bool:
        return self._abandoned

    def abandon(self) -> None:
        with self._lock:
            self._abandoned = True
            for loop, task in self._running:
                loop.call_soon_threadsafe(task.cancel)

    async def run(self, call: Coroutine[Any, Any, T]) -> T:
        task = asyncio.ensure_future(call)
        entry = (asyncio.get_running_loop(), task)
        with self._lock:
            if self._abandoned:
                task.cancel()
            self._running.add(entry)
        try:
            return await task
        except asyncio.CancelledError:
            if self._abandoned:
                raise AdminCallAbandoned("the call was given up: Arbiter is stopping") from None
            raise
        finally:
            with self._lock:
                self._running.discard(entry)


# Set by the owner of the admin calls made in this context (the service sync's worker thread).
admin_calls: contextvars.ContextVar[AdminCalls | None] = contextvars.ContextVar("arbiter_admin_calls", default=None)


def _run(call: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(call)``, on a thread of its own when this one already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(call)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, call).result()


@contextlib.contextmanager
def translate_errors(url: str, timeout: float) -> Iterator[None]:
    """aiohttp's errors as the BackendError tree."""
    try:
        yield
    except aiohttp.ConnectionTimeoutError as exc:  # could not even connect: unreachable, not slow
        raise BackendUnreachable(f"cannot connect to {url}: timed out") from exc
    except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
        raise BackendTimeout(f"{url} did not answer within {timeout:g}s") from exc
    except aiohttp.ClientConnectorError as exc:
        raise BackendUnreachable(f"cannot connect to {url}: {exc.os_error or exc}") from exc
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientOSError) as exc:
        raise BackendBroken(f"{url} broke the connection: {type(exc).__name__}") from exc
    except aiohttp.ClientResponseError as exc:
        raise BackendBroken(f"{url} sent a malformed answer: {exc.message}") from exc
    except aiohttp.ClientError as exc:
        raise BackendBroken(f"{url} failed: {type(exc).__name__}") from exc


class AiohttpStream:
    """One answer from a backend, read whole (with a cap) or chunk by chunk as it arrives."""

    def __init__(self, url: str, response: aiohttp.ClientResponse, timeout: float) -> None:
        self._url = url
        self._response = response
        self._timeout = timeout
        self.status = response.status
        self.content_type: str | None = response.headers.get("Content-Type")
        self.retry_after: str | None = response.headers.get("Retry-After")
        self.credential_refused = False  # set by a backend whose protocol marks it (the mesh)

    def header(self, name: str) -> str | None:
        return self._response.headers.get(name)

    async def read(self, limit: int) -> bytes:
        declared = self._response.content_length
        if declared is not None and declared > limit:
            raise ReplyTooLarge(f"{self._url} answered {declared} bytes, over the {limit}-byte response cap")
        parts: list[bytes] = []
        size = 0
        with translate_errors(self._url, self._timeout):
            async for chunk in self._response.content.iter_any():
                size += len(chunk)
                if size > limit:
                    raise ReplyTooLarge(f"{self._url} answered more than the {limit}-byte response cap")
                parts.append(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def chunks(self) -> AsyncIterator[bytes]:
        with translate_errors(self._url, self._timeout):
            async for chunk in self._response.content.iter_any():
                yield chunk

    async def close(self) -> None:
        self._response.release()
