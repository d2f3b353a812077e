"""A backend's answer as it arrives (``AiohttpStream``, what ``HttpBackendBase.open`` returns for
chat, pulls and the mesh), and aiohttp's errors translated into the BackendError tree."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator

import aiohttp

from infra_adapters.base import BackendBroken, BackendTimeout, BackendUnreachable, Reply, ReplyTooLarge, Stream

__all__ = ["AiohttpStream", "read_reply", "translate_errors"]


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


async def read_reply(stream: Stream, limit: int) -> Reply:
    """The whole of ``stream`` as a Reply (ReplyTooLarge past ``limit``), its connection released."""
    try:
        return Reply(stream.status, stream.content_type, await stream.read(limit), stream.retry_after,
                     stream.credential_refused)
    finally:
        await stream.close()
