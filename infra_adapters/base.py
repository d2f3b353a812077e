"""The interface every backend adapter implements, and the errors it raises.

An adapter knows HTTP and one backend's protocol; it knows nothing of tenants.
Forwarding (the hot path) uses one pooled client per backend (infra_adapters/h1.py,
and an aiohttp session for streams); admin calls (version, model lists) are async
and share one pooled httpx client, the AdminClient of the running event loop
(infra_adapters/admin.py).

    BackendError
    ├── BackendUnreachable   could not connect (refused, DNS, TLS)
    ├── BackendBroken        connection dropped or reset mid-answer
    ├── BackendTimeout       no complete answer within the timeout
    ├── ReplyTooLarge        the answer is over the response cap
    └── BackendProtocolError the answer is not what the protocol promises
        └── BackendAuthRejected  the backend refused Arbiter's own credential
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


class BackendError(Exception):
    """A backend failed; the message names the backend and what happened, never a secret."""


class BackendUnreachable(BackendError):
    pass


class BackendBroken(BackendError):
    pass


class BackendTimeout(BackendError):
    pass


class ReplyTooLarge(BackendError):
    pass


class BackendProtocolError(BackendError):
    pass


class BackendAuthRejected(BackendProtocolError):
    pass


class ReplyNotOk(Exception):
    """A backend answered a call made on a request's behalf with something other than a 200 (a
    prompt over its context, a refused credential, its own 5xx): the answer goes back to the
    caller as it came, and the forwarding path judges it as any backend's answer."""

    def __init__(self, reply: Reply) -> None:
        super().__init__(f"HTTP {reply.status}")
        self.reply = reply


@dataclass(frozen=True, slots=True)
class RemoteModel:
    """A model as the backend lists it."""

    name: str
    capabilities: frozenset[str] = field(default_factory=frozenset)
    details: dict[str, Any] = field(default_factory=dict)
    # Why the backend could not tell what this model is (its capabilities are unknown), or None.
    unreadable: str | None = None


@dataclass(frozen=True, slots=True)
class Reply:
    """A backend's answer, as bytes: passed through unchanged unless it is a 200."""

    status: int
    content_type: str | None
    body: bytes
    retry_after: str | None = None  # the backend's Retry-After, passed on with its error
    # The backend marked this 401/403 as a refusal of Arbiter's own credential (a mesh peer does).
    credential_refused: bool = False


@dataclass(frozen=True, slots=True)
class CallOptions:
    """Per-call settings that come from the gateway, not the request."""

    timeout: float
    max_reply_bytes: int
    headers: dict[str, str] = field(default_factory=dict)  # traceparent, tracestate, request id
    tenant_salt: str | None = None  # per-project prefix-cache salt, for backends that take one
    streaming: bool = False  # the timeout is then the longest silence, not the whole answer
    mesh_hops: int = 0  # mesh hops the request has taken to reach this node (a mesh peer's backend adds one)
    # The calling project's own key where ``tenant_salt`` has been combined with the caller's
    # ``cache_salt`` (label reading's reads): what per-project queues and caches are split by.
    partition: str | None = None

    @property
    def project_key(self) -> str | None:
        """What per-project queues and caches (in-process models, read strategies) are split by:
        the project's own salt, never one a caller can vary."""
        return self.partition if self.partition is not None else self.tenant_salt


class Stream(Protocol):
    """An answer being received: status and headers now, the body as it arrives."""

    status: int
    content_type: str | None
    retry_after: str | None
    credential_refused: bool  # as on Reply

    def chunks(self) -> Any:
        """Async iterator of body chunks, in the order they arrive."""

    async def read(self, limit: int) -> bytes:
        """The whole body (ReplyTooLarge past ``limit``)."""

    async def close(self) -> None:
        """Release the connection."""


class Backend(Protocol):
    """One backend instance (a service). Implemented by OllamaBackend, VllmBackend."""

    kind: str
    url: str

    @property
    def has_credential(self) -> bool:
        """True when Arbiter sends its own credential to this backend."""

    def rejected_own_credential(self, answer: Reply | Stream) -> bool:
        """True when ``answer`` refuses Arbiter's own credential (a 500 ``upstream_auth_error``
        for the caller), not the request (the backend's own 401/403, passed through)."""

    async def read_version(self) -> str | None:
        """The backend's version string, or None when it gives none it can read."""

    async def list_models(self) -> list[RemoteModel]:
        """The models the backend serves, with their capabilities."""

    async def systemone(self, body: dict[str, Any], options: CallOptions) -> Reply:
        """POST a System One request (``body`` already carries the backend's model name)."""

    def decisions_unsupported(self, reply: Reply) -> bool:
        """True when ``reply`` says the backend has no decision endpoint at all."""

    def route(self, api: str) -> str | None:
        """The backend path for a public API ("openai-chat", "ollama-chat", "embed",
        "openai-decisions"), or None when the backend does not speak it."""

    async def open(self, path: str, body: dict[str, Any], options: CallOptions) -> Stream:
        """POST ``body`` to ``path`` and return the answer as a stream."""

    async def aclose(self) -> None:
        """Close pooled connections."""
