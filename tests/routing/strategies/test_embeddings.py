"""The embeddings strategy's texts, probabilities and passage cache, without a backend."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from app.errors import InvalidRequest
from app.routing.strategies import embeddings
from infra_adapters.embedders import Embedded, Role, prefixes_for, share_tokens
from infra_adapters.emulators.generation import embedding_vector


class Counting:
    """An embedder over the emulators' bag-of-words vectors that records what it was asked."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], Role]] = []

    async def embed(self, texts: Sequence[str], role: Role) -> Embedded:
        self.calls.append((list(texts), role))
        await asyncio.sleep(0)
        return Embedded([embedding_vector(t) for t in texts], [len(t.split()) for t in texts])

    async def aclose(self) -> None:
        return None


def test_passages_per_question_type() -> None:
    choice = {"type": "choice", "criteria": {"billing": "refunds", "shipping": None, "x": ""}}
    assert embeddings.passages("q", choice) == ["billing: refunds", "shipping", "x"]
    assert embeddings.passages("q", {"type": "score", "criteria": ["calm", {"a": 1}]}) == ["calm", '{"a":1}']
    noul = {"type": "noul", "instructions": "It is urgent", "criteria": None}
    assert embeddings.passages("q", noul) == ["It is urgent", "not: It is urgent"]
    both = {"type": "noul", "criteria": {"true": "urgent", "false": "can wait"}}
    assert embeddings.passages("q", both) == ["urgent", "can wait"]
    with pytest.raises(InvalidRequest, match="questions.q"):
        embeddings.passages("q", {"type": "noul"})


def test_query_holds_both_instructions_then_the_state() -> None:
    question = {"type": "choice", "instructions": "Which team?", "criteria": {"a": None}}
    assert embeddings.query_text({"t": "x"}, question, "Be brief") == 'Be brief\nWhich team?\n{"t": "x"}'
    assert embeddings.query_text("plain", {"type": "noul"}) == "plain"


def test_temperature_sharpens_and_the_answer_follows_the_best_similarity() -> None:
    question = {"type": "choice", "criteria": {"a": None, "b": None}}
    cold, _ = embeddings.answer(question, [0.80, 0.82], 0.002)
    warm, diagnostics = embeddings.answer(question, [0.80, 0.82], 1.0)
    assert cold["choice"] == warm["choice"] == "b"
    assert cold["confidence"] > 0.99 and 0.5 < warm["confidence"] < 0.6
    assert diagnostics == {"label_mass": 1.0, "similarities": [0.80, 0.82]}


def test_the_cache_embeds_a_passage_once_and_stays_bounded() -> None:
    async def walk() -> tuple[Counting, embeddings.PassageCache]:
        embedder, cache = Counting(), embeddings.PassageCache(size=3)
        await asyncio.gather(cache.vectors(["a b", "c"], embedder), cache.vectors(["c", "a b"], embedder))
        _, tokens = await cache.vectors(["a b", "c"], embedder)
        assert tokens == 3  # cached texts still count their tokens
        await cache.vectors(["d", "e"], embedder)
        assert len(cache) == 3
        return embedder, cache

    embedder, _ = asyncio.run(walk())
    assert embedder.calls == [(["a b", "c"], "passage"), (["d", "e"], "passage")]


def test_decide_embeds_queries_in_one_batch() -> None:
    body = {"state": "refund my payment", "questions": {
        "team": {"type": "choice", "criteria": {"billing": "payment refund", "shipping": "parcel"}},
        "tone": {"type": "score", "criteria": ["calm", "angry"]}}}
    embedder = Counting()
    answer = asyncio.run(embeddings.decide(body, embedder, embeddings.PassageCache()))
    assert embedder.calls[0] == (["refund my payment"], "query")  # both questions share one query
    assert list(answer["answers"]) == ["team", "tone"] and answer["answers"]["team"]["choice"] == "billing"
    assert answer["usage"]["input_tokens"] == 3 + 3 + 2 + 1 + 1


def test_family_prefixes_and_token_shares() -> None:
    assert prefixes_for("intfloat/multilingual-e5-small") == ("query: ", "passage: ")
    assert prefixes_for("nomic-embed-text:latest") == ("search_query: ", "search_document: ")
    assert prefixes_for("bge-m3") == ("", "")
    assert sum(share_tokens(10, ["aaaa", "b", "cc"])) == 10 and min(share_tokens(1, ["a", "b"])) == 1
