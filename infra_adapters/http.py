"""HTTP plumbing shared by the adapters: a pooled aiohttp session and the lean client
(infra_adapters/h1.py) for forwarding; admin calls through an AdminClient (infra_adapters/admin.py:
one pooled httpx client, each call within a total deadline); answers as they arrive in
infra_adapters/streams.py."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from infra_adapters.admin import AdminClient, shown_url
from infra_adapters.base import CallOptions, Reply, Stream
from infra_adapters.h1 import H1Pool
from infra_adapters.streams import AiohttpStream, translate_errors

__all__ = ["HttpBackendBase"]


class HttpBackendBase:
    """Holds the URL, the credential and the pools of one backend."""

    kind = "http"

    def __init__(self, url: str, *, credential: str | None = None, connect_timeout: float = 5.0,
                 admin_timeout: float = 10.0, pool_size: int = 256, admin: AdminClient | None = None) -> None:
        """``admin``: the AdminClient of the running loop (the app's, a CLI command's); None makes a
        short-lived one per admin call, so a backend never holds a pool bound to a loop gone since."""
        self.url = url.rstrip("/")
        self.shown_url = shown_url(self.url)  # for messages: without a user and password
        self._admin = admin
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

    # -- admin calls (async, httpx: infra_adapters/admin.py) ----------------------------

    def _admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._credential}"} if self._credential else {}

    async def _admin_get(self, path: str) -> Any:
        return await self._admin_request("GET", path)

    async def _admin_post(self, path: str, payload: dict[str, Any]) -> Any:
        return await self._admin_request("POST", path, payload)

    async def _admin_request(self, method: str, path: str, payload: dict[str, Any] | None = None, *,
                             missing_ok: bool = False) -> Any:
        """One admin call, answered in full within ``admin_timeout`` (AdminClient.request)."""
        if self._admin is not None:
            return await self._admin_call(self._admin, method, path, payload, missing_ok)
        async with AdminClient(timeout=self._admin_timeout, connect_timeout=self._connect_timeout) as admin:
            return await self._admin_call(admin, method, path, payload, missing_ok)

    async def _admin_call(self, admin: AdminClient, method: str, path: str, payload: dict[str, Any] | None,
                          missing_ok: bool) -> Any:
        return await admin.request(method, self.url + path, payload=payload, headers=self._admin_headers(),
                                   timeout=self._admin_timeout, missing_ok=missing_ok, base=self.url)

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
        """POST and read the whole answer, through the lean client (infra_adapters/h1.py). A subclass
        whose ``open`` reshapes chat bodies (vLLM's salt) still posts decisions here as they are; one
        that must sign what it sends overrides this too (app/mesh/backend.py)."""
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

