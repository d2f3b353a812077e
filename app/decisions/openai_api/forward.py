"""The Forwarder for OpenAI decisions: the same checks, limits, replicas, retries and spans as
``/v1/systemone``; only the backend call differs, per replica.

- A backend with its own ``/v1/decisions`` (vLLM: ``route("openai-decisions")``) gets the body
  straight, with ``model`` set to its name for the model; so does a mesh peer. A vLLM gets it in
  the form vLLM 0.33's ``DecisionRequest`` takes (``vllm/entrypoints/openai/decisions/protocol.py``,
  ``extra="forbid"``, strict strings), which says the same thing (``vllm_form``), and the project's
  prefix-cache salt (as ``/v1/systemone`` gets it). A vLLM that predates the route answers its
  unknown-route 404 (``decisions_unsupported``; every mesh peer has the route), and a vLLM model
  without a decisions read strategy answers 501 (vLLM always registers the route:
  ``openai/decisions/api_router.py``); the request is then translated onto its ``/v1/systemone``
  instead.
- Any other backend gets the request translated onto ``/v1/systemone``, and its answer is
  translated back (``translate``).
Either way what comes back is an OpenAI answer, so token counts and ``model`` are read as usual.
"""

from __future__ import annotations

from typing import Any

import orjson

from app.decisions.forward import Forwarder
from app.decisions.openai_api import translate
from app.routing.registry import Replica
from infra_adapters.base import Backend, CallOptions, Reply
from infra_adapters.streams import read_reply
from infra_adapters.vllm import VllmBackend

API = "openai-decisions"


class OpenAIDecisionForwarder(Forwarder):
    async def _send(self, replica: Replica, forwarded: dict[str, Any], call: CallOptions) -> Reply:
        backend = replica.backend
        path = backend.route(API)
        if path is not None:
            reply = await _post(backend, path, _straight(backend, forwarded, call), call)
            if reply.status != 501 and not backend.decisions_unsupported(reply):
                return reply
        return await _translated(backend, forwarded, call)


def _straight(backend: Backend, body: dict[str, Any], call: CallOptions) -> dict[str, Any]:
    if isinstance(backend, VllmBackend):
        return VllmBackend.prepare(vllm_form(body), call.tenant_salt)
    return body


def vllm_form(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` as vLLM's ``DecisionRequest`` takes it (a copy): the prompt-cache hints left out
    (``prompt_cache_key``, ``prompt_cache_options``, a part's ``prompt_cache_breakpoint``: vLLM
    refuses them, and a tenant never picks a cache key; the project's salt keeps its prefixes its
    own), explicit nulls left out (``"name": null``, ``"description": null``: vLLM's defaults),
    instructions given as ``input_text`` parts joined into one text with "\n", as vLLM joins
    the parts of one message (``adapters.input_text``), and instructions or descriptions of any
    other JSON kind sent as their compact JSON text (vLLM's ``DecisionRequest`` takes strings only)."""
    form = {key: value for key, value in body.items() if key not in _CACHE_HINTS}
    if isinstance(form.get("input"), list):
        form["input"] = [_message(message) for message in form["input"]]
    form["questions"] = [_question(question) for question in form["questions"]]
    return form


_CACHE_HINTS = ("prompt_cache_key", "prompt_cache_options")


def _message(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if not isinstance(content, list):
        return message
    return {**message, "content": [{k: v for k, v in part.items() if k != "prompt_cache_breakpoint"}
                                   for part in content]}


def _question(question: dict[str, Any]) -> dict[str, Any]:
    form = {key: value for key, value in question.items() if not (key == "name" and value is None)}
    if not isinstance(form.get("instructions"), str):  # parts, or any JSON value: vLLM takes text
        form["instructions"] = translate.text_of(form["instructions"])
    for field in ("choices", "levels"):
        if isinstance(form.get(field), list):
            form[field] = [{k: translate.described(v) if k == "description" else v for k, v in entry.items()
                            if not (k == "description" and v is None)} for entry in form[field]]
    return form


async def _translated(backend: Backend, body: dict[str, Any], call: CallOptions) -> Reply:
    request, asked = translate.to_systemone(body)
    reply = await backend.systemone(request, call)
    if reply.status != 200:
        return reply
    # Translated or a 502: a System One answer never goes back on this endpoint as it came.
    converted = translate.from_systemone(translate.read_answer(reply.body), asked, body["model"])
    return Reply(200, "application/json", orjson.dumps(converted))


async def _post(backend: Backend, path: str, body: dict[str, Any], call: CallOptions) -> Reply:
    return await read_reply(await backend.open(path, body, call), call.max_reply_bytes)
