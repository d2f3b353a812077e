"""What the read strategies' backends share (label_backend.py, embedding_backend.py): each wraps a
service's backend for one model, answers decisions its own way (``decide``), and hands everything
else (chat, embeddings, versions, model lists, credentials) to the service's backend as it is."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson

from app.errors import ArbiterError, BackendFailed, InvalidRequest
from infra_adapters.base import (
    Backend,
    BackendProtocolError,
    BackendTimeout,
    CallOptions,
    RemoteModel,
    Reply,
    ReplyNotOk,
    Stream,
)
from infra_adapters.media import MEDIA_FIELDS

log = logging.getLogger("arbiter.read_strategy")


class StrategyBackend:
    kind: str  # the model's read_strategy
    reading: str  # how it answers, for messages: "label reading", "embedding similarity"
    not_in_time: str  # "was not read", "did not embed": what a timeout says of the model

    def __init__(self, inner: Backend, model: str) -> None:
        self.inner = inner
        self.url = inner.url
        self.model = model

    @property
    def has_credential(self) -> bool:
        return self.inner.has_credential

    def rejected_own_credential(self, answer: Reply | Stream) -> bool:
        return self.inner.rejected_own_credential(answer)

    async def read_version(self) -> str | None:
        return await self.inner.read_version()

    async def list_models(self) -> list[RemoteModel]:
        return await self.inner.list_models()

    def route(self, api: str) -> str | None:
        # The OpenAI Decisions API is translated onto /v1/systemone, that is onto this strategy,
        # never sent to the backend's own /v1/decisions.
        return None if api == "openai-decisions" else self.inner.route(api)

    async def open(self, path: str, body: dict[str, Any], options: CallOptions) -> Stream:
        return await self.inner.open(path, body, options)

    def decisions_unsupported(self, reply: Reply) -> bool:
        return False  # the strategy needs nothing of the backend's own decision endpoint

    async def decide(self, body: dict[str, Any], options: CallOptions) -> dict[str, Any]:
        """The System One answer (without ``model``) to ``body``; ArbiterError for a question this
        strategy cannot answer (the tenant's 400), ReplyNotOk for the backend's own refusal."""
        raise NotImplementedError

    async def systemone(self, body: dict[str, Any], options: CallOptions) -> Reply:
        media = [field for field in MEDIA_FIELDS if body.get(field)]
        if media:
            return refusal(InvalidRequest(f"model '{self.model}' answers decisions by {self.reading}, which "
                                          f"reads text only; it cannot take {', '.join(media)}"))
        try:
            async with asyncio.timeout(options.timeout or None):
                answer = await self.decide(body, options)
        except ArbiterError as error:  # a question that cannot be answered this way: the tenant's 400
            return refusal(error)
        except ReplyNotOk as refused:  # the backend's own answer to a call: judged as any backend's
            return refused.reply
        except TimeoutError as exc:
            raise BackendTimeout(f"model '{self.model}' {self.not_in_time} within {options.timeout:g}s") from exc
        except BackendProtocolError as exc:
            # A 200 that cannot be used (no logprobs, no embeddings) is this answer's fault, not the
            # replica's: a 502 that takes nothing out of service (SPEC §4: a connection error, a
            # timeout or the backend's own 502/503/504 do).
            log.warning("%s of model %s on %s failed: %s", self.reading, self.model, self.url, exc)
            raise BackendFailed(502, str(exc)) from exc
        return Reply(200, "application/json", orjson.dumps({"model": body.get("model", self.model), **answer}))


def refusal(error: ArbiterError) -> Reply:
    return Reply(error.status, "application/json", error.body(), retry_after=error.headers.get("Retry-After"))
