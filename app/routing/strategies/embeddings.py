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

Passages are the same from request to request, so they are embedded once per model and project and
kept in a bounded LRU (``PassageCache``) with their token counts, split per project
(``partitioned.PartitionedLru``): a project never gets a hit on another's passages, whose speed
would tell it what that project asks. Usage counts every text a request's answer used, cached or
not, so a tenant's count never says what another tenant asked before.

A request's work is capped (issue 30): at most ``MAX_PASSAGES`` option texts over all its
questions and ``MAX_PASSAGE_CHARS`` characters of them (a 400 over either, cached or not, so the
cap says nothing of the cache). Similarities are computed with each vector's norm kept beside it,
and on a worker thread of their own (``SIMILARITY_THREAD``) when a request's passages times
dimensions pass ``OFF_LOOP_WORK``, pausing every few passages, so the event loop is held a few
milliseconds at most (bench/embeddings_loop.py).

Pure domain code: what embeds is an ``Embedder`` (``infra_adapters.embedders`` over HTTP,
``infra_adapters.local_e5`` in the process).
"""

from __future__ import annotations

import array
import asyncio
import math
import operator
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from app.errors import InvalidRequest, RateLimited
from app.routing.strategies import answer_warnings, labels
from app.routing.strategies.partitioned import PartitionedLru
from infra_adapters.embedders import Embedded, Role
from infra_adapters.in_process import FairQueue, QueueFull

# Calibrated on bench/data/tickets.jsonl with multilingual-e5-small (docs/labels.md): the
# temperature that minimises the mean negative log-likelihood of the right team (0.179; mean
# confidence 0.91 at 92 % accuracy). e5's similarities lie close together (0.8 to 0.9), so
# it is small; a model whose similarities spread wider wants a larger one, set per model.
DEFAULT_TEMPERATURE = 0.002
MIN_TEMPERATURE, MAX_TEMPERATURE = 0.0001, 10.0
CACHE_SIZE = 2048  # passages kept per model and project
CACHE_TOTAL = 8192  # passages kept per model over all projects (a 768-dimension vector: 6 KiB)
# The work of one request: option texts over all its questions (the same text in two questions
# counts twice: it is compared twice), and their characters.
MAX_PASSAGES = 1024
MAX_PASSAGE_CHARS = 128 * 1024
# Passages x dimensions past which a request's similarities leave the event loop (about 2 ms of
# pure Python at 65,536 multiplications on the 2-core VM of docs/labels.md).
OFF_LOOP_WORK = 65_536
# One thread for all models' similarities: a bounded worker, so many large requests queue there
# rather than each taking a thread of the default pool (and a share of the loop's interpreter);
# its queue is served in turn across projects, as an in-process model's is, so one project's
# backlog delays another's work by at most the one running.
SIMILARITY_QUEUED_PER_PROJECT = 64
SIMILARITY_THREAD = FairQueue(SIMILARITY_QUEUED_PER_PROJECT, "arbiter-similarity")
PAUSE_EVERY = 32  # passages between two hand-backs of the interpreter on that thread (~0.3 ms at 384)
PAUSE = 0.0001  # seconds: a real sleep, so that the loop takes the interpreter (sleep(0) lets it be retaken)
NEGATION = "not: "


class Embedder(Protocol):
    """Embeds texts as queries or as passages (a model may prefix each role its own way)."""

    async def embed(self, texts: Sequence[str], role: Role) -> Embedded: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Row:
    """An embedded text: its vector, the vector's norm, its tokens, and whether it was cut to the
    model's window before embedding."""

    vector: Sequence[float]
    norm: float
    tokens: int
    truncated: bool = False


def rows_of(embedded: Embedded) -> list[Row]:
    cut = embedded.truncated or [False] * len(embedded.vectors)
    return [Row(array.array("d", vector), norm(vector), tokens, truncated)
            for vector, tokens, truncated in zip(embedded.vectors, embedded.tokens, cut)]


class PassageCache:
    """Passage text -> its ``Row``, the last ``size`` used per project (``partition``: the
    project's key) and ``total`` over all; one per model."""

    def __init__(self, size: int = CACHE_SIZE, total: int = CACHE_TOTAL) -> None:
        self._items: PartitionedLru[str, Row] = PartitionedLru(size, max(size, total))
        # One lock per project: concurrent requests of one project for the same new passages embed
        # them once; another project never waits on it (its wait would be another side channel).
        self._locks: weakref.WeakValueDictionary[str | None, asyncio.Lock] = weakref.WeakValueDictionary()

    def __len__(self) -> int:
        return len(self._items)

    def size_of(self, partition: str | None) -> int:
        return self._items.size_of(partition)

    async def rows(self, texts: Sequence[str], embedder: Embedder, partition: str | None = None) -> list[Row]:
        """The rows of ``texts`` in order, embedding only those the project has not cached (one
        batch)."""
        lock = self._locks.get(partition)
        if lock is None:
            lock = self._locks[partition] = asyncio.Lock()
        async with lock:
            kept = {text: self._items.get(partition, text) for text in dict.fromkeys(texts)}
            found = {text: row for text, row in kept.items() if row is not None}
            missing = [text for text, row in kept.items() if row is None]
            if missing:
                found.update(zip(missing, rows_of(await embedder.embed(missing, "passage")), strict=True))
            for text in kept:
                self._items.put(partition, text, found[text])
        return [found[text] for text in texts]

    async def vectors(self, texts: Sequence[str], embedder: Embedder,
                      partition: str | None = None) -> tuple[list[Sequence[float]], int]:
        """The vectors of ``texts`` and their tokens (``rows``)."""
        rows = await self.rows(texts, embedder, partition)
        return [row.vector for row in rows], sum(row.tokens for row in rows)


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


def norm(vector: Sequence[float]) -> float:
    return math.sqrt(math.fsum(map(operator.mul, vector, vector)))


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    scale = norm(a) * norm(b)
    return math.fsum(map(operator.mul, a, b)) / scale if scale else 0.0


def similarities(pairs: Sequence[tuple[Row, Sequence[Row]]], pause: bool = False) -> list[list[float]]:
    """For each (query, passages) pair, the cosine similarity of the query with each passage.
    ``pause`` (on a worker thread): the thread sleeps ``PAUSE`` after every ``PAUSE_EVERY``
    passages, so the event loop takes the interpreter then rather than waiting for Python's
    switch interval (5 ms). bench/embeddings_loop.py measures it (docs/labels.md)."""
    found = []
    for query, rows in pairs:
        sims: list[float] = []
        for start in range(0, len(rows), PAUSE_EVERY):
            sims.extend(math.fsum(map(operator.mul, query.vector, row.vector)) / (query.norm * row.norm)
                        if query.norm and row.norm else 0.0 for row in rows[start:start + PAUSE_EVERY])
            if pause:
                time.sleep(PAUSE)
        found.append(sims)
    return found


async def similarities_off_loop(pairs: Sequence[tuple[Row, Sequence[Row]]],
                                partition: str | None = None) -> list[list[float]]:
    """``similarities``, on ``SIMILARITY_THREAD`` in ``partition``'s (the project's) turn when the
    work is past ``OFF_LOOP_WORK``; a project with SIMILARITY_QUEUED_PER_PROJECT waiting gets 429."""
    work = sum(len(rows) * len(query.vector) for query, rows in pairs)
    if work <= OFF_LOOP_WORK:
        return similarities(pairs)
    try:
        future = SIMILARITY_THREAD.submit(partition, similarities, pairs, True)
    except QueueFull:
        raise RateLimited(f"this project has {SIMILARITY_QUEUED_PER_PROJECT} embedding comparisons waiting "
                          "already; retry after a second, or send fewer requests at once",
                          headers={"Retry-After": "1"}) from None
    return await asyncio.wrap_future(future)


def check_work(plans: Sequence[tuple[str, Mapping[str, Any], Sequence[str]]]) -> None:
    """The cap on one request's work (``MAX_PASSAGES``, ``MAX_PASSAGE_CHARS``): a 400 past it."""
    count = sum(len(texts) for _, _, texts in plans)
    if count > MAX_PASSAGES:
        raise InvalidRequest(f"this request compares {count} option texts; a model read by the embeddings strategy "
                             f"compares at most {MAX_PASSAGES} in one request (over all its questions): split it "
                             "into several requests")
    chars = sum(len(text) for _, _, texts in plans for text in texts)
    if chars > MAX_PASSAGE_CHARS:
        raise InvalidRequest(f"this request's option texts hold {chars} characters; a model read by the embeddings "
                             f"strategy embeds at most {MAX_PASSAGE_CHARS} in one request (over all its "
                             "questions): shorten the descriptions or split the request")


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
                 temperature: float = DEFAULT_TEMPERATURE, partition: str | None = None) -> dict[str, Any]:
    """``answers``, ``usage`` and ``diagnostics`` for a System One request already validated
    (``app.decisions.schema.validate``): every question is checked before anything is embedded,
    the queries go in one batch, the passages the project has not cached (``partition``: its key)
    in another."""
    state, instructions = body["state"], body.get("instructions")
    questions: Mapping[str, Mapping[str, Any]] = body["questions"]
    plans = [(qid, question, passages(qid, question)) for qid, question in questions.items()]
    check_work(plans)
    queries = [query_text(state, question, instructions) for _, question, _ in plans]
    unique = list(dict.fromkeys(queries))
    embedded = await embedder.embed(unique, "query")
    by_query = dict(zip(unique, rows_of(embedded)))
    every = await cache.rows([text for _, _, texts in plans for text in texts], embedder, partition)
    await asyncio.sleep(0)  # all cached, nothing suspended: requests resumed together take turns here
    pairs: list[tuple[Row, Sequence[Row]]] = []
    start = 0
    for (_, _, texts), query in zip(plans, queries):
        pairs.append((by_query[query], every[start:start + len(texts)]))
        start += len(texts)
    found = await similarities_off_loop(pairs, partition)
    answers: dict[str, Any] = {}
    diagnostics: dict[str, Any] = {}
    tokens = sum(embedded.tokens)
    for (qid, question, _), (asked, rows), sims in zip(plans, pairs, found):
        tokens += sum(row.tokens for row in rows)
        answers[qid], diagnostics[qid] = answer(question, sims, temperature)
        warning = answer_warnings.truncated(asked.truncated, sum(row.truncated for row in rows))
        if warning is not None:
            diagnostics[qid]["warnings"] = [warning]
    usage = {"input_tokens": tokens, "output_tokens": 0, "input_tokens_details": {"cached_tokens": 0}}
    return {"answers": answers, "usage": usage, "diagnostics": diagnostics}
