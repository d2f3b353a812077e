"""Chat (and embeddings for the Test action) forwarded to models with the capability:
OpenAI's /v1/chat/completions and Ollama's /api/chat, streaming passed through as it arrives."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

from opentelemetry.trace import Span

from app.errors import BackendFailed, InvalidRequest
from app.routing.answers import rewrite_model
from app.routing.forwarding import (
    FAULT_STATUSES,
    FaultAnswer,
    Waited,
    backend_failure,
    credential_refused,
    failover,
    failure_verdict,
)
from app.routing.registry import Registry, Replica
from app.routing.router import ReplicaRouter
from app.settings import Settings
from app.telemetry.tracing import Tracing, annotate
from app.tenancy.limits import RateLimiter, limits_of
from app.tenancy.principal import Principal
from app.tenancy.salts import TenantSalts
from infra_adapters.base import BackendError, CallOptions, ReplyTooLarge, Stream
from infra_adapters.media import media_kind

API_CAPABILITY = {"openai-chat": "completion", "ollama-chat": "completion", "embed": "embedding"}
CHAT_PATHS = {"openai-chat": "/v1/chat/completions", "ollama-chat": "/api/chat"}
_OPERATIONS = {"openai-chat": "chat", "ollama-chat": "chat", "embed": "embeddings"}  # gen_ai.operation.name
_CHAT_NAMES = {"openai-chat": "OpenAI's /v1/chat/completions", "ollama-chat": "Ollama's /api/chat"}


@dataclass
class Answer:
    """A backend's answer on its way to the caller; ``close()`` must be called. A timeout or a
    broken connection while it is read is a 504 or 502 (``BackendFailed``), and takes the
    replica out as it would have before the answer began (SPEC §4)."""

    replica: Replica
    stream: Stream
    model: str  # the public name the caller used
    max_bytes: int
    router: ReplicaRouter
    span: Span | None = None  # the CLIENT span of the call, ended with the answer
    waited: float = 0.0  # seconds spent waiting for the backend: its head, then its bytes
    counted: bool = True  # in the replica's in-flight count until ``close()``

    @property
    def status(self) -> int:
        return self.stream.status

    @property
    def content_type(self) -> str:
        return self.stream.content_type or "application/octet-stream"

    @property
    def is_json(self) -> bool:
        return self.content_type.split(";")[0].strip() == "application/json"

    async def whole(self) -> bytes:
        """The whole answer; a JSON object's ``model`` becomes the public name."""
        started = time.perf_counter()
        try:
            body = await self.stream.read(self.max_bytes)
        except BackendError as exc:
            raise self._failed(exc) from exc
        finally:
            self.waited += time.perf_counter() - started
        return rewrite_model(body, self.replica.backend_name, self.model) if self.status == 200 else body

    async def chunks(self) -> AsyncIterator[bytes]:
        """The answer's chunks as they arrive."""
        chunks = aiter(self.stream.chunks())
        while True:
            started = time.perf_counter()
            try:
                chunk = await anext(chunks)
            except StopAsyncIteration:
                return
            except BackendError as exc:
                raise self._failed(exc) from exc
            finally:
                self.waited += time.perf_counter() - started
            yield chunk

    async def keep(self) -> Answer | None:
        """This answer read whole, its connection released (``close()`` is done): a replica's
        502/503/504 kept while another replica is tried, to come back as it came when no other
        replica answers (SPEC §4). None when it breaks off while read."""
        try:
            body = await self.whole()
        except BackendFailed:
            return None
        finally:
            await self.close()
        stream = self.stream
        return Answer(self.replica, Kept(stream.status, stream.content_type, stream.retry_after, body),
                      self.model, self.max_bytes, self.router, waited=self.waited, counted=False)

    async def close(self) -> None:
        if self.counted:
            self.replica.in_flight -= 1
        if self.span is not None:
            annotate(self.span, status=self.status,
                     response_model=self.replica.backend_name if self.status == 200 else None)
            self.span.end()
        await self.stream.close()

    def _failed(self, exc: BackendError) -> BackendFailed:
        if not isinstance(exc, ReplyTooLarge):
            self.router.take_out(self.replica)
        return backend_failure(self.model, self.replica, exc, self.max_bytes)


@dataclass
class Kept:
    """A ``Stream`` read whole already (see ``Answer.keep``)."""

    status: int
    content_type: str | None
    retry_after: str | None
    body: bytes
    credential_refused: bool = False

    async def chunks(self) -> AsyncIterator[bytes]:
        yield self.body

    async def read(self, limit: int) -> bytes:
        return self.body

    async def close(self) -> None:
        return None


class ChatForwarder:
    def __init__(self, registry: Registry, router: ReplicaRouter, settings: Settings,
                 limiter: RateLimiter | None = None, tracing: Tracing | None = None, *,
                 salts: TenantSalts | None = None) -> None:
        self._limiter = limiter
        self._tracing = tracing or Tracing(None, state=False, state_max_bytes=0)
        self._salts = salts or TenantSalts(settings)  # the app's one, keyed at start-up (salts.py)
        self._registry = registry
        self._router = router
        self._settings = settings
        self._by_api = {api: _ChatForwarding(api, registry, router, self._tracing) for api in API_CAPABILITY}

    def check(self, principal: Principal | None, body: Any, api: str) -> list[Replica]:
        """The replicas that may take this request, or the error that says why none may."""
        model = body.get("model") if isinstance(body, dict) else None
        if not isinstance(body, dict):
            raise InvalidRequest("the body must be a JSON object")
        if not isinstance(model, str) or not model:
            raise InvalidRequest("model: field required (a non-empty string)")
        target = self._registry.resolve(model)  # an alias's target; the answer keeps ``model``
        if principal is not None:
            principal.authorize(target, model)
        kinds = {media_kind(item) for item in _media_items(body.get("messages"))}
        if "other" in kinds:
            raise InvalidRequest("media in messages must be base64 or data: URLs; no other URL scheme is accepted")
        if "remote" in kinds and not self._settings.allow_remote_media_urls:
            raise InvalidRequest("remote media URLs are not accepted in messages; send base64 or data: URLs "
                                 "(an admin can allow URLs with ARBITER_ALLOW_REMOTE_MEDIA_URLS)")
        entry = self._registry.find(target, principal.mesh_hops if principal is not None else 0, "chat")
        needed = API_CAPABILITY[api]
        replicas = [r for r in entry.replicas if needed in r.capabilities]
        if not replicas:
            if needed == "completion":
                raise InvalidRequest(f"model '{model}' has no completion capability: it serves only the "
                                     "decision endpoints (/v1/systemone)" if "decision" in entry.capabilities
                                     else f"model '{model}' has no completion capability")
            raise InvalidRequest(f"model '{model}' has no {needed} capability")
        speaking = [r for r in replicas if r.backend.route(api)]
        if not speaking:
            raise InvalidRequest(_unspoken(model, api, replicas))
        return speaking

    async def admit(self, principal: Principal) -> None:
        """Request and token limits apply to chat as to decisions: one request and one token to
        enter, the rest of its tokens charged when its answer or stream ends (``charge``)."""
        requests, tokens = limits_of(principal)
        if self._limiter is not None and (requests or tokens):
            await self._limiter.admit(requests, tokens)

    async def charge(self, principal: Principal, used: int) -> None:
        """Spend the tokens a chat used (app/chat/tokens.py ``charged``) from its token buckets."""
        tokens = limits_of(principal)[1]
        if tokens and self._limiter is not None:
            await self._limiter.charge(tokens, used)

    async def open(self, replicas: list[Replica], body: dict[str, Any], api: str,
                   headers: dict[str, str], principal: Principal | None = None) -> Answer:
        """Send to a replica; retried once elsewhere when it fails before answering, by the
        forwarding core's rule, as for decisions (app/routing/forwarding.py, SPEC §4)."""
        options = CallOptions(timeout=0.0, max_reply_bytes=self._settings.max_response_bytes, headers=headers,
                              streaming=True, tenant_salt=self._salts.of_caller(principal) if principal else None,
                              mesh_hops=principal.mesh_hops if principal else 0)
        waited: Waited = [0.0]  # on every attempt's backend: not the gateway's own time
        answer = await failover(self._by_api[api], self._router, replicas, body["model"], body, options, waited)
        answer.waited = waited[0]  # a held answer's too: every attempt's wait, not only its own
        return answer


class _ChatForwarding:
    """The attempts at one chat API (``forwarding.Forwarding``): an answer is opened and streams on to
    the caller, in a CLIENT span that ends with it; a replica's 502/503/504 is read whole only to
    be held while another replica is tried."""

    def __init__(self, api: str, registry: Registry, router: ReplicaRouter, tracing: Tracing) -> None:
        self._api = api
        self._operation = _OPERATIONS[api]
        self._registry = registry
        self._router = router
        self._tracing = tracing

    async def attempt(self, model: str, replica: Replica, forwarded: dict[str, Any],
                      options: CallOptions, waited: Waited) -> Answer:
        sent = dict(options.headers)
        span = self._tracing.open_client_span(self._operation, model, replica.provider, replica.backend.url, sent)
        call = CallOptions(timeout=replica.timeout, max_reply_bytes=options.max_reply_bytes, headers=sent,
                           streaming=True, tenant_salt=options.tenant_salt, mesh_hops=options.mesh_hops)
        replica.in_flight += 1
        started = time.perf_counter()
        try:
            stream = await replica.backend.open(replica.backend.route(self._api) or "", forwarded, call)
        except BaseException as exc:  # a cancel too (the client hung up): the count is never left behind
            replica.in_flight -= 1
            waited[0] += time.perf_counter() - started
            if span is not None:
                annotate(span, error_type=type(exc).__name__)
                span.end()
            if isinstance(exc, BackendError):
                raise failure_verdict(model, replica, exc, call.max_reply_bytes) from exc
            raise
        waited[0] += time.perf_counter() - started
        answer = Answer(replica, stream, model, call.max_reply_bytes, self._router, span, waited[0])
        if replica.backend.rejected_own_credential(stream):  # about this service's key, not the request
            await answer.close()
            raise credential_refused(self._registry, replica, stream.status)
        if stream.status in FAULT_STATUSES:  # nothing of it is sent yet
            raise FaultAnswer(answer)
        return answer

    async def hold(self, answer: Answer, waited: Waited) -> Answer | None:
        kept = await answer.keep()
        waited[0] = answer.waited  # its head, then its body
        return kept


def _unspoken(model: str, api: str, replicas: list[Replica]) -> str:
    """Why no replica of the model takes ``api``, naming the chat route that would work."""
    if api not in CHAT_PATHS:
        return f"model '{model}' is served by a backend that serves no embeddings API"
    for other, path in CHAT_PATHS.items():
        if other != api and any(r.backend.route(other) for r in replicas):
            return f"model '{model}' is served by a backend that does not speak {_CHAT_NAMES[api]}; use {path}"
    return f"model '{model}' is served by a backend that serves no chat API"


def _media_items(messages: Any) -> Iterator[str]:
    """The media of messages (OpenAI image_url/video_url/audio parts, Ollama images): a backend
    fetching a URL among them would be a server-side request forgery."""
    if not isinstance(messages, list):
        return
    for message in messages:
        if not isinstance(message, dict):
            continue
        candidates: list[Any] = list(message.get("images") or []) if isinstance(message.get("images"), list) else []
        content = message.get("content")
        if isinstance(content, list):
            for part in content:
                if isinstance(part, dict):
                    for field in ("image_url", "video_url", "audio_url", "input_image", "file"):
                        value = part.get(field)
                        candidates.append(value.get("url") if isinstance(value, dict) else value)
        yield from (c for c in candidates if isinstance(c, str))
