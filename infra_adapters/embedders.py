"""Embeddings of one model over HTTP, for the ``embeddings`` read strategy
(``app.routing.strategies.embedding_backend.ModelEmbedder``). Two dialects:

- ``ollama``: ``POST /api/embed`` ``{"model", "input": [texts], "truncate": false}`` answers
  ``{"model", "embeddings": [[float]], "prompt_eval_count"}`` (Ollama's ``api/types.go``
  ``EmbedRequest`` / ``EmbedResponse``, ``server/routes.go`` ``EmbedHandler``, which L2-normalises
  each vector). ``truncate: false``: a text over the context is Ollama's 400, passed on, rather
  than compared after a silent cut.
- ``openai``: ``POST /v1/embeddings`` ``{"model", "input": [texts], "encoding_format": "float"}``
  answers ``{"data": [{"index", "embedding"}], "usage": {"prompt_tokens"}}`` (OpenAI's API, and
  vLLM 0.33's ``vllm/entrypoints/pooling/embed/protocol.py`` ``EmbeddingResponse``).

Some model families want each text prefixed by its role (e5: ``query: `` / ``passage: ``; nomic's
``search_query: `` / ``search_document: ``): ``prefixes_for`` finds the rule by the model's name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from infra_adapters.base import BackendProtocolError, CallOptions, ReplyNotOk
from infra_adapters.http import HttpBackendBase

Role = Literal["query", "passage"]
PATHS = {"ollama": "/api/embed", "openai": "/v1/embeddings"}
# Model-name fragment -> (query prefix, passage prefix); the first that the name holds wins.
FAMILY_PREFIXES: tuple[tuple[str, tuple[str, str]], ...] = (
    ("e5", ("query: ", "passage: ")),
    ("nomic-embed", ("search_query: ", "search_document: ")),
)
EMBED_REPLY_BYTES = 64 << 20  # a batch of vectors as JSON floats


@dataclass(frozen=True, slots=True)
class Embedded:
    """Vectors of a batch of texts, in order, the tokens each one took, and (when the embedder cuts
    texts to the model's window) whether each was cut; empty: none was."""

    vectors: list[list[float]]
    tokens: list[int]
    truncated: list[bool] = field(default_factory=list)


def share_tokens(total: int, texts: Sequence[str]) -> list[int]:
    """A batch's token count shared over its texts by length (a backend counts the batch only),
    each at least 1, summing to ``total`` when that allows."""
    if not texts:
        return []
    weights = [max(1, len(text)) for text in texts]
    whole = sum(weights)
    shares = [max(1, total * w // whole) for w in weights]
    shares[-1] = max(1, shares[-1] + total - sum(shares))
    return shares


def prefixes_for(model: str) -> tuple[str, str]:
    name = model.lower()
    for fragment, prefixes in FAMILY_PREFIXES:
        if fragment in name:
            return prefixes
    return "", ""


class HttpEmbedder(HttpBackendBase):
    """Embeds texts with one model of an Ollama (``/api/embed``) or an OpenAI-compatible server."""

    kind = "embedder"

    def __init__(self, url: str, model: str, *, dialect: str = "openai", **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        if dialect not in PATHS:
            raise ValueError(f"unknown dialect {dialect!r}; use one of {sorted(PATHS)}")
        self.model, self.dialect = model, dialect
        self.prefixes = prefixes_for(model)

    def request_body(self, texts: Sequence[str], role: Role) -> dict[str, Any]:
        prefix = self.prefixes[0 if role == "query" else 1]
        body: dict[str, Any] = {"model": self.model, "input": [prefix + text for text in texts]}
        if self.dialect == "ollama":
            body["truncate"] = False
        else:
            body["encoding_format"] = "float"
        return body

    async def embed_with(self, options: CallOptions, texts: Sequence[str], role: Role) -> Embedded:
        if not texts:
            return Embedded([], [])
        body = self.request_body(texts, role)
        call = CallOptions(timeout=options.timeout, max_reply_bytes=EMBED_REPLY_BYTES, headers=options.headers)
        reply = await self._post(PATHS[self.dialect], body, call)
        if reply.status != 200:  # a text over the context, a refused key, its own 5xx: passed on
            raise ReplyNotOk(reply)
        try:
            vectors, tokens = self._parse(orjson.loads(reply.body), len(texts))
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise BackendProtocolError(
                f"the backend's {PATHS[self.dialect]} answered without one embedding per text") from exc
        return Embedded(vectors, share_tokens(tokens, body["input"]))

    def _parse(self, answer: Any, count: int) -> tuple[list[list[float]], int]:
        if self.dialect == "ollama":
            vectors = answer["embeddings"]
            tokens = int(answer.get("prompt_eval_count") or 0)
        else:
            rows = sorted(answer["data"], key=lambda row: int(row["index"]))
            vectors = [row["embedding"] for row in rows]
            tokens = int((answer.get("usage") or {}).get("prompt_tokens") or 0)
        if len(vectors) != count or not all(isinstance(v, list) and v for v in vectors):
            raise ValueError("one embedding per text")
        return [[float(x) for x in vector] for vector in vectors], tokens
