"""What the read strategies' backends share (label_backend.py, embedding_backend.py): each wraps a
service's backend for one model, answers decisions its own way, and hands everything else
(chat, embeddings, versions, model lists, credentials) to the service's backend as it is."""

from __future__ import annotations

from typing import Any

from infra_adapters.base import Backend, CallOptions, RemoteModel, Reply, Stream


class StrategyBackend:
    kind: str  # the model's read_strategy

    def __init__(self, inner: Backend, model: str) -> None:
        self.inner = inner
        self.url = inner.url
        self.model = model

    @property
    def has_credential(self) -> bool:
        return self.inner.has_credential

    def rejected_own_credential(self, answer: Reply | Stream) -> bool:
        return self.inner.rejected_own_credential(answer)

    def read_version(self) -> str | None:
        return self.inner.read_version()

    def list_models(self) -> list[RemoteModel]:
        return self.inner.list_models()

    def route(self, api: str) -> str | None:
        # The OpenAI Decisions API is translated onto /v1/systemone, that is onto this strategy,
        # never sent to the backend's own /v1/decisions.
        return None if api == "openai-decisions" else self.inner.route(api)

    async def open(self, path: str, body: dict[str, Any], options: CallOptions) -> Stream:
        return await self.inner.open(path, body, options)

    def decisions_unsupported(self, reply: Reply) -> bool:
        return False  # the strategy needs nothing of the backend's own decision endpoint
