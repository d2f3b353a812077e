"""An embedding model as a decision model: the backend of a model whose ``read_strategy`` is
``embeddings``. The forwarding path sends it a System One request like to any backend; this answers
it by similarity (``embeddings.decide``) over what the service offers: Ollama's ``/api/embed``,
an OpenAI-compatible ``/v1/embeddings`` (vLLM's among them), or the local e5 model.

Passages are cached per model and project (``embeddings.PassageCache``, split by the caller's
``CallOptions.project_key``) for as long as this backend lives:
the registry keeps it across reloads while its service's backend is the same, and sets the
model's temperature on it at each reload.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from app.routing.strategies import embeddings
from app.routing.strategies.base import StrategyBackend
from infra_adapters.base import Backend, CallOptions


class EmbeddingBackend(StrategyBackend):
    """Wraps a service's backend for one model: decisions by embedding similarity, anything else
    (embeddings themselves, versions, model lists) by the service's backend as it is."""

    kind = "embeddings"
    reading, not_in_time = "embedding similarity", "did not embed"
    default_temperature = embeddings.DEFAULT_TEMPERATURE

    def __init__(self, inner: Backend, model: str, embedder: ModelEmbedder,
                 temperature: float | None = None, cache_size: int = embeddings.CACHE_SIZE,
                 cache_total: int = embeddings.CACHE_TOTAL) -> None:
        super().__init__(inner, model)
        self.temperature = temperature or embeddings.DEFAULT_TEMPERATURE
        self.cache = embeddings.PassageCache(cache_size, cache_total)
        self._embedder = embedder

    async def decide(self, body: dict[str, Any], options: CallOptions) -> dict[str, Any]:
        return await embeddings.decide(body, _Bound(self._embedder, options), self.cache, self.temperature,
                                       options.project_key)

    async def aclose(self) -> None:
        await self._embedder.aclose()


class ModelEmbedder(Protocol):
    """Embeds texts with one model, each call with the options of the request it serves."""

    async def embed_with(self, options: CallOptions, texts: Sequence[str],
                         role: embeddings.Role) -> embeddings.Embedded: ...

    async def aclose(self) -> None: ...


class _Bound:
    """A ModelEmbedder with one call's options: the ``embeddings.Embedder`` of one request."""

    def __init__(self, embedder: ModelEmbedder, options: CallOptions) -> None:
        self._embedder, self._options = embedder, options

    async def embed(self, texts: Sequence[str], role: embeddings.Role) -> embeddings.Embedded:
        return await self._embedder.embed_with(self._options, texts, role)

    async def aclose(self) -> None:
        return None
