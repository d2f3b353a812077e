"""The Forwarder for OpenAI decisions: the same checks, limits, replicas, retries and spans as
``/v1/systemone``; only the backend call differs, per replica.

- A backend with its own ``/v1/decisions`` (vLLM: ``route("openai-decisions")``) gets the body
  straight, with ``model`` set to its name for the model and, for vLLM, the project's prefix-cache
  salt (as ``/v1/systemone`` gets it); so does a mesh peer. A vLLM or a peer that predates the
  route answers its unknown-route 404 (``decisions_unsupported``); the request is then translated
  onto its ``/v1/systemone`` instead.
- Any other backend gets the request translated onto ``/v1/systemone``, and its answer is
  translated back (``translate``).
Either way what comes back is an OpenAI answer, so token counts and ``model`` are read as usual.
"""

from __future__ import annotations

from typing import Any

import orjson

from app.decisions.forward import Forwarder
from app.decisions.openai_api import translate
from app.services.registry import Replica
from infra_adapters.base import Backend, CallOptions, Reply
from infra_adapters.vllm import VllmBackend

API = "openai-decisions"


class OpenAIDecisionForwarder(Forwarder):
    async def _send(self, replica: Replica, forwarded: dict[str, Any], call: CallOptions) -> Reply:
        backend = replica.backend
        path = backend.route(API)
        if path is not None:
            reply = await _post(backend, path, _straight(backend, forwarded, call), call)
            if not backend.decisions_unsupported(reply):
                return reply
        return await _translated(backend, forwarded, call)


def _straight(backend: Backend, body: dict[str, Any], call: CallOptions) -> dict[str, Any]:
    if isinstance(backend, VllmBackend):
        return VllmBackend.prepare(dict(body), call.tenant_salt)
    return body


async def _translated(backend: Backend, body: dict[str, Any], call: CallOptions) -> Reply:
    request, asked = translate.to_systemone(body)
    reply = await backend.systemone(request, call)
    if reply.status != 200:
        return reply
    # Translated or a 502: a System One answer never goes back on this endpoint as it came.
    converted = translate.from_systemone(translate.read_answer(reply.body), asked, body["model"])
    return Reply(200, "application/json", orjson.dumps(converted))


async def _post(backend: Backend, path: str, body: dict[str, Any], call: CallOptions) -> Reply:
    stream = await backend.open(path, body, call)
    try:
        return Reply(stream.status, stream.content_type, await stream.read(call.max_reply_bytes),
                     stream.retry_after, stream.credential_refused)
    finally:
        await stream.close()
