"""Embedding reading: any embedding model answers System One questions (issue 20).

Each question compares one **query** with one **passage** per option, by cosine similarity:

- the query: the request's ``instructions`` and the question's ``instructions`` (each when given,
  a line each), then the state as text (``labels.content_text``: a string as-is, anything else
  JSON);
- the passages: for a ``choice`` each option as ``name: description`` (the name alone when the
  description is empty); for a ``score`` each level's text; for a ``noul`` the ``true`` and
  ``false`` descriptions, where an absent ``true`` is the question's instructions (the statement)
  and an absent ``false`` is ``not: <the true passage>``. A noul with neither descriptions nor
  instructions has nothing to compare: a 400.

Probabilities are a softmax over ``similarity / temperature`` (a temperature per model, default
``DEFAULT_TEMPERATURE``, calibrated on bench/data/tickets.jsonl; docs/labels.md). The answer has
the shape of label reading's (``labels.answer_from_read``): ``confidence`` is the chosen option's
probability times ``label_mass``, which is 1 here (all the mass is on the options).

Passages are the same from request to request, so they are embedded once per model and kept in a
bounded LRU (``PassageCache``) with their token counts. Usage counts every text a request's
answer used, cached or not, so a tenant's count never says what another tenant asked before.

Pure domain code: what embeds is an ``Embedder`` (``infra_adapters.embedders`` over HTTP,
``infra_adapters.local_e5`` in the process).
"""

from __future__ import annotations

import asyncio
import collections
import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from app.errors import InvalidRequest
from app.routing.strategies import labels
from infra_adapters.embedders import Embedded, Role

# Calibrated on bench/data/tickets.jsonl with multilingual-e5-small (docs/labels.md): the
# temperature that minimises the mean negative log-likelihood of the right team (0.179; mean
# confidence 0.91 at 92 % accuracy). e5's similarities lie close together (0.8 to 0.9), so
# it is small; a model whose similarities spread wider wants a larger one, set per model.
DEFAULT_TEMPERATURE = 0.002
MIN_TEMPERATURE, MAX_TEMPERATURE = 0.0001, 10.0
CACHE_SIZE = 4096  # passages per model
NEGATION = "not: "


class Embedder(Protocol):
    """Embeds texts as queries or as passages (a model may prefix each role its own way)."""

    async def embed(self, texts: Sequence[str], role: Role) -> Embedded: ...

    async def aclose(self) -> None: ...


class PassageCache:
    """Passage text -> (vector, tokens), the last ``size`` used; one per model."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self._size = size
        self._items: collections.OrderedDict[str, tuple[list[float], int]] = collections.OrderedDict()
        self._lock = asyncio.Lock()

    def __len__(self) -> int:
        return len(self._items)

    async def vectors(self, texts: Sequence[str], embedder: Embedder) -> tuple[list[list[float]], int]:
        """The vectors of ``texts`` and their tokens, embedding only those not cached (one batch;
        concurrent requests for the same new passages embed them once)."""
        async with self._lock:
            missing = list(dict.fromkeys(text for text in texts if text not in self._items))
            if missing:
                found = await embedder.embed(missing, "passage")
                for text, vector, tokens in zip(missing, found.vectors, found.tokens):
                    self._items[text] = (vector, tokens)
            rows = []
            for text in texts:
                self._items.move_to_end(text)
                rows.append(self._items[text])
            while len(self._items) > self._size:
                self._items.popitem(last=False)
        return [vector for vector, _ in rows], sum(tokens for _, tokens in rows)


# -- texts ---------------------------------------------------------------------


def query_text(state: Any, question: Mapping[str, Any], instructions: Any = None) -> str:
    heading = [labels.compact_text(v) for v in (instructions, question.get("instructions")) if v is not None]
    return "\n".join([*(line for line in heading if line), labels.content_text(state)])


def passages(qid: str, question: Mapping[str, Any]) -> list[str]:
    """One passage per option, in the answer's order (``yes`` before ``no`` for a noul)."""
    qtype = question["type"]
    criteria: Any = question.get("criteria")
    if qtype == "choice":
        texts = []
        for name, desc in criteria.items():
            shown = None if desc is None else labels.compact_text(desc)
            texts.append(f"{name}: {shown}" if shown else str(name))
        return texts
    if qtype == "score":
        return [labels.compact_text(level) for level in criteria]
    criteria = criteria or {}
    statement = question.get("instructions")
    true = criteria.get("true")
    if true in (None, ""):
        true = statement
    if true in (None, ""):
        raise InvalidRequest(f"questions.{qid}: this model answers a noul by comparing the state with its "
                             "'true' and 'false' descriptions, or with its instructions; give one of them")
    true_text = labels.compact_text(true)
    false = criteria.get("false")
    false_text = labels.compact_text(false) if false not in (None, "") else NEGATION + true_text
    return [true_text, false_text]


# -- answers -------------------------------------------------------------------


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = math.fsum(x * y for x, y in zip(a, b))
    norm = math.sqrt(math.fsum(x * x for x in a)) * math.sqrt(math.fsum(y * y for y in b))
    return dot / norm if norm else 0.0


def probabilities(similarities: Sequence[float], temperature: float) -> list[float]:
    return labels.softmax([s / temperature for s in similarities])


def answer(question: Mapping[str, Any], similarities: Sequence[float],
           temperature: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """One System One answer and its diagnostics entry, from the options' similarities."""
    probs = probabilities(similarities, temperature)
    best = max(range(len(probs)), key=lambda i: (probs[i], -i))
    diagnostics = {"label_mass": 1.0, "similarities": list(similarities)}
    qtype = question["type"]
    if qtype == "noul":
        return {"type": "noul", "noul": probs[0], "probabilities": {"yes": probs[0], "no": probs[1]},
                "confidence": probs[best]}, diagnostics
    if qtype == "choice":
        names = list(question["criteria"])
        return {"type": "choice", "choice": names[best], "probabilities": dict(zip(names, probs)),
                "confidence": probs[best]}, diagnostics
    return {"type": "score", "score": math.fsum(i * p for i, p in enumerate(probs)),
            "legend": {str(i): level for i, level in enumerate(question["criteria"])},
            "probabilities": {str(i): p for i, p in enumerate(probs)},
            "confidence": probs[best]}, diagnostics


async def decide(body: Mapping[str, Any], embedder: Embedder, cache: PassageCache,
                 temperature: float = DEFAULT_TEMPERATURE) -> dict[str, Any]:
    """``answers``, ``usage`` and ``diagnostics`` for a System One request already validated
    (``app.decisions.schema.validate``): every question is checked before anything is embedded,
    the queries go in one batch, the passages not cached in another."""
    state, instructions = body["state"], body.get("instructions")
    questions: Mapping[str, Mapping[str, Any]] = body["questions"]
    plans = [(qid, question, passages(qid, question)) for qid, question in questions.items()]
    queries = [query_text(state, question, instructions) for _, question, _ in plans]
    unique = list(dict.fromkeys(queries))
    embedded = await embedder.embed(unique, "query")
    by_query = dict(zip(unique, embedded.vectors))
    answers: dict[str, Any] = {}
    diagnostics: dict[str, Any] = {}
    tokens = sum(embedded.tokens)
    for (qid, question, texts), query in zip(plans, queries):
        vectors, passage_tokens = await cache.vectors(texts, embedder)
        tokens += passage_tokens
        similarities = [cosine(by_query[query], vector) for vector in vectors]
        answers[qid], diagnostics[qid] = answer(question, similarities, temperature)
    usage = {"input_tokens": tokens, "output_tokens": 0, "input_tokens_details": {"cached_tokens": 0}}
    return {"answers": answers, "usage": usage, "diagnostics": diagnostics}
