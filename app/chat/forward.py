"""Chat (and embeddings for the Test action) forwarded to models with the capability:
OpenAI's /v1/chat/completions and Ollama's /api/chat, streaming passed through as it arrives."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.decisions.forward import rejected_credential, rewrite_model
from app.errors import BackendFailed, InvalidRequest, UpstreamAuthFailed
from app.services.registry import Registry, Replica
from app.services.routing import ReplicaRouter
from app.settings import Settings
from app.tenancy.limits import RateLimiter, limits_of
from app.tenancy.principal import Principal
from app.tenancy.salts import TenantSalts
from infra_adapters.base import BackendError, BackendTimeout, CallOptions, Stream

_FAULT_STATUSES = frozenset({502, 503, 504})
API_CAPABILITY = {"openai-chat": "completion", "ollama-chat": "completion", "embed": "embedding"}


@dataclass
class Answer:
    """A backend's answer on its way to the caller; ``close()`` must be called."""

    replica: Replica
    stream: Stream
    max_bytes: int

    @property
    def status(self) -> int:
        return self.stream.status

    @property
    def content_type(self) -> str:
        return self.stream.content_type or "application/octet-stream"

    @property
    def is_json(self) -> bool:
        return self.content_type.split(";")[0].strip() == "application/json"

    async def whole(self, public_name: str) -> bytes:
        """The whole answer; a JSON object's ``model`` becomes the public name."""
        body = await self.stream.read(self.max_bytes)
        return rewrite_model(body, self.replica.backend_name, public_name) if self.status == 200 else body

    async def close(self) -> None:
        self.replica.in_flight -= 1
        await self.stream.close()


class ChatForwarder:
    def __init__(self, registry: Registry, router: ReplicaRouter, settings: Settings,
                 limiter: RateLimiter | None = None) -> None:
        self._limiter = limiter
        self._salts = TenantSalts(settings)
        self._registry = registry
        self._router = router
        self._settings = settings

    def check(self, principal: Principal | None, body: Any, api: str) -> list[Replica]:
        """The replicas that may take this request, or the error that says why none may."""
        model = body.get("model") if isinstance(body, dict) else None
        if not isinstance(body, dict):
            raise InvalidRequest("the body must be a JSON object")
        if not isinstance(model, str) or not model:
            raise InvalidRequest("model: field required (a non-empty string)")
        if principal is not None:
            principal.authorize(model)
        if not self._settings.allow_remote_media_urls and _remote_media(body.get("messages")):
            raise InvalidRequest("remote media URLs are not accepted in messages; send base64 or data: URLs "
                                 "(an admin can allow URLs with ARBITER_ALLOW_REMOTE_MEDIA_URLS)")
        entry = self._registry.find(model, principal.mesh_hops if principal is not None else 0, "chat")
        needed = API_CAPABILITY[api]
        replicas = [r for r in entry.replicas if needed in r.capabilities]
        if not replicas:
            if needed == "completion":
                raise InvalidRequest(f"model '{model}' has no completion capability: it serves only the "
                                     "decision endpoints (/v1/systemone)" if "decision" in entry.capabilities
                                     else f"model '{model}' has no completion capability")
            raise InvalidRequest(f"model '{model}' has no {needed} capability")
        replicas = [r for r in replicas if r.backend.route(api)]
        if not replicas:
            raise InvalidRequest(f"model '{model}' is served by a backend that does not speak Ollama's "
                                 "/api/chat; use /v1/chat/completions")
        return replicas

    async def admit(self, principal: Principal) -> None:
        """Request limits apply to chat too (its tokens are not charged: streams carry no usage)."""
        requests, tokens = limits_of(principal)
        if self._limiter is not None and (requests or tokens):
            await self._limiter.admit(requests, tokens)

    async def open(self, replicas: list[Replica], body: dict[str, Any], api: str,
                   headers: dict[str, str], principal: Principal | None = None) -> Answer:
        """Send to a replica; retried once elsewhere when it fails before answering."""
        model = body["model"]
        tried: set[int] = set()
        last: BackendFailed | None = None
        for _attempt in range(2):
            replica = self._router.pick(replicas, tried)
            if replica is None:
                break
            tried.add(id(replica))
            forwarded = dict(body)
            forwarded["model"] = replica.backend_name
            options = CallOptions(timeout=replica.timeout, max_reply_bytes=self._settings.max_response_bytes,
                                  headers=headers, streaming=True,
                                  tenant_salt=self._salts.of_caller(principal) if principal else None,
                                  mesh_hops=principal.mesh_hops if principal else 0)
            replica.in_flight += 1
            try:
                stream = await replica.backend.open(replica.backend.route(api) or "", forwarded, options)
            except BackendError as exc:
                replica.in_flight -= 1
                self._router.take_out(replica)
                last = (BackendFailed(504, f"model '{model}' did not answer within {replica.timeout:g}s")
                        if isinstance(exc, BackendTimeout)
                        else BackendFailed(502, f"the backend of model '{model}' could not be reached"))
                last.__cause__ = exc
                continue
            answer = Answer(replica, stream, self._settings.max_response_bytes)
            if replica.backend.rejected_own_credential(stream):
                await answer.close()
                raise UpstreamAuthFailed(rejected_credential(replica))
            if stream.status in _FAULT_STATUSES:
                self._router.take_out(replica)
                if self._router.pick(replicas, tried) is not None:
                    await answer.close()  # nothing sent yet: try another replica
                    continue
            return answer
        if last is not None:
            raise last
        raise BackendFailed(503, f"every backend that serves model '{model}' is down or backed off; "
                                 "try again shortly", retry_after=self._router.retry_after)


def _remote_media(messages: Any) -> bool:
    """An http(s) URL in a message's media (OpenAI image_url/video_url/audio parts, Ollama images):
    a backend fetching it would be a server-side request forgery."""
    if not isinstance(messages, list):
        return False
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
        if any(isinstance(c, str) and c[:8].lower().startswith(("http://", "https://")) for c in candidates):
            return True
    return False
