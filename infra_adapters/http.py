"""HTTP plumbing shared by the adapters: a pooled aiohttp session for forwarding,
httpx for admin calls; transport errors translated into the BackendError tree."""

from __future__ import annotations

from typing import Any

import aiohttp
import httpx
import orjson

from infra_adapters.base import (
    BackendBroken,
    BackendProtocolError,
    BackendTimeout,
    BackendUnreachable,
    CallOptions,
    Reply,
    ReplyTooLarge,
)


class HttpBackendBase:
    """Holds the URL, the credential and the pools of one backend."""

    kind = "http"

    def __init__(self, url: str, *, credential: str | None = None, connect_timeout: float = 5.0,
                 admin_timeout: float = 10.0, pool_size: int = 256) -> None:
        self.url = url.rstrip("/")
        self._credential = credential
        self._connect_timeout = connect_timeout
        self._admin_timeout = admin_timeout
        self._pool_size = pool_size
        self._session: aiohttp.ClientSession | None = None
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}

    @property
    def has_credential(self) -> bool:
        return bool(self._credential)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={self.url!r}, credential={'***' if self._credential else None})"

    # -- admin calls (sync, httpx) -------------------------------------------------

    def _admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._credential}"} if self._credential else {}

    def _admin_get(self, path: str) -> Any:
        return self._admin_request("GET", path)

    def _admin_post(self, path: str, payload: dict[str, Any]) -> Any:
        return self._admin_request("POST", path, payload)

    def _admin_request(self, method: str, path: str, payload: dict[str, Any] | None = None) -> Any:
        timeout = httpx.Timeout(self._admin_timeout, connect=self._connect_timeout)
        try:
            with httpx.Client(timeout=timeout) as client:
                response = client.request(method, self.url + path, json=payload,
                                          headers=self._admin_headers())
        except httpx.TimeoutException as exc:
            raise BackendTimeout(f"{self.url}{path} did not answer within {self._admin_timeout:g}s") from exc
        except httpx.HTTPError as exc:
            raise BackendUnreachable(f"cannot reach {self.url}: {type(exc).__name__}") from exc
        if response.status_code in (401, 403):
            raise BackendProtocolError(
                f"{self.url}{path} refused Arbiter's credential (HTTP {response.status_code})")
        if response.status_code != 200:
            raise BackendProtocolError(f"{self.url}{path} answered HTTP {response.status_code}")
        try:
            return response.json()
        except ValueError as exc:
            raise BackendProtocolError(f"{self.url}{path} answered something that is not JSON") from exc

    # -- forwarding (async, aiohttp) -----------------------------------------------

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self._pool_size, limit_per_host=self._pool_size,
                                             ttl_dns_cache=300, enable_cleanup_closed=True)
            self._session = aiohttp.ClientSession(connector=connector, auto_decompress=True,
                                                  skip_auto_headers=("User-Agent",))
        return self._session

    def _timeout(self, seconds: float) -> aiohttp.ClientTimeout:
        timeout = self._timeouts.get(seconds)
        if timeout is None:
            timeout = aiohttp.ClientTimeout(total=seconds, connect=min(self._connect_timeout, seconds))
            self._timeouts[seconds] = timeout
        return timeout

    async def _post(self, path: str, body: dict[str, Any], options: CallOptions) -> Reply:
        payload = orjson.dumps(body)
        headers = {"Content-Type": "application/json", "Accept-Encoding": "identity",
                   "User-Agent": "arbiter", **options.headers}
        if self._credential:
            headers["Authorization"] = f"Bearer {self._credential}"
        url = self.url + path
        try:
            async with self._client().post(url, data=payload, headers=headers,
                                           timeout=self._timeout(options.timeout)) as response:
                declared = response.content_length
                if declared is not None and declared > options.max_reply_bytes:
                    raise ReplyTooLarge(f"{url} answered {declared} bytes, over the "
                                        f"{options.max_reply_bytes}-byte response cap")
                chunks: list[bytes] = []
                size = 0
                async for chunk in response.content.iter_any():
                    size += len(chunk)
                    if size > options.max_reply_bytes:
                        raise ReplyTooLarge(f"{url} answered more than the "
                                            f"{options.max_reply_bytes}-byte response cap")
                    chunks.append(chunk)
                return Reply(response.status, response.headers.get("Content-Type"), b"".join(chunks))
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise BackendTimeout(f"{url} did not answer within {options.timeout:g}s") from exc
        except aiohttp.ClientConnectorError as exc:
            raise BackendUnreachable(f"cannot connect to {self.url}: {exc.os_error or exc}") from exc
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError,
                aiohttp.ClientOSError) as exc:
            raise BackendBroken(f"{url} broke the connection: {type(exc).__name__}") from exc
        except aiohttp.ClientResponseError as exc:
            raise BackendBroken(f"{url} sent a malformed answer: {exc.message}") from exc
        except aiohttp.ClientError as exc:
            raise BackendBroken(f"{url} failed: {type(exc).__name__}") from exc

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None
