"""The embeddings strategy's texts, probabilities and passage cache, without a backend."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import pytest

from app.errors import InvalidRequest, RateLimited
from app.routing.strategies import embeddings
from app.routing.strategies.embedding_backend import EmbeddingBackend
from infra_adapters.base import CallOptions
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


# -- issue 30: one request's work, the cache per project, the loop ------------------------------


def test_a_project_never_gets_a_hit_on_another_projects_passages() -> None:
    """A hit is faster (9 ms against 15 ms in the issue): it would tell one tenant what options
    another had just sent. Through the strategy's backend, the project is the call's tenant salt."""
    embedder = CountingModel()
    backend = EmbeddingBackend(Inner(), "e5", embedder)  # type: ignore[arg-type]
    body = {"state": "refund my payment", "questions": {
        "team": {"type": "choice", "criteria": {"billing": "payment refund", "shipping": "parcel"}}}}

    async def walk() -> None:
        await backend.decide(body, CallOptions(10, 1 << 20, tenant_salt="project-a"))
        await backend.decide(body, CallOptions(10, 1 << 20, tenant_salt="project-a"))
        await backend.decide(body, CallOptions(10, 1 << 20, tenant_salt="project-b"))

    asyncio.run(walk())
    passages = [texts for texts, role in embedder.calls if role == "passage"]
    # A's second request hits its own entries; B's first embeds the same texts again.
    assert passages == [["billing: payment refund", "shipping: parcel"]] * 2
    assert backend.cache.size_of("project-a") == backend.cache.size_of("project-b") == 2


def test_a_projects_passages_are_bounded_apart_from_anothers() -> None:
    async def walk() -> embeddings.PassageCache:
        embedder, cache = Counting(), embeddings.PassageCache(size=2, total=8)
        await cache.rows(["kept"], embedder, "b")
        await cache.rows([f"t{i}" for i in range(6)], embedder, "a")
        assert cache.size_of("a") == 2 and cache.size_of("b") == 1
        await cache.rows(["kept"], embedder, "b")
        assert embedder.calls.count((["kept"], "passage")) == 1  # A's many texts did not evict it
        return cache

    assert len(asyncio.run(walk())) == 3


def test_one_requests_work_is_capped() -> None:
    many = {f"option {i}": None for i in range(200)}
    over = {"state": "s", "questions": {f"q{j}": {"type": "choice", "criteria": many} for j in range(6)}}
    with pytest.raises(InvalidRequest, match=f"embeddings strategy compares at most {embeddings.MAX_PASSAGES}"):
        asyncio.run(embeddings.decide(over, Counting(), embeddings.PassageCache()))
    long = {f"o{i}": "x" * 2000 for i in range(80)}  # 160,000 characters, in 80 options
    with pytest.raises(InvalidRequest, match=f"embeds at most {embeddings.MAX_PASSAGE_CHARS}"):
        asyncio.run(embeddings.decide({"state": "s", "questions": {"q": {"type": "choice", "criteria": long}}},
                                      Counting(), embeddings.PassageCache()))
    # Cached or not: a cap that only counted texts to embed would tell what is cached.
    within = {"state": "s", "questions": {f"q{j}": {"type": "choice", "criteria": many} for j in range(5)}}
    assert len(asyncio.run(embeddings.decide(within, Counting(), embeddings.PassageCache()))["answers"]) == 5


def test_large_similarity_work_runs_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[str] = []
    compute = embeddings.similarities

    def recorded(pairs: Sequence[tuple[embeddings.Row, Sequence[embeddings.Row]]],
                 pause: bool = False) -> list[list[float]]:
        threads.append(threading.current_thread().name)
        return compute(pairs, pause)

    class Wide(Counting):  # e5-small's 384 dimensions
        async def embed(self, texts: Sequence[str], role: Role) -> Embedded:
            return Embedded([embedding_vector(t, 384) for t in texts], [1] * len(texts))

    monkeypatch.setattr(embeddings, "similarities", recorded)
    small = {"state": "s", "questions": {"q": {"type": "choice", "criteria": {"a": None, "b": None}}}}
    options = {f"option {i}": f"what option {i} is about" for i in range(255)}
    large = {"state": "s", "questions": {"q": {"type": "choice", "criteria": options}}}
    asyncio.run(embeddings.decide(small, Wide(), embeddings.PassageCache()))
    answer = asyncio.run(embeddings.decide(large, Wide(), embeddings.PassageCache()))
    assert threads[0] == threading.main_thread().name  # 2 options: not worth a thread hop
    assert threads[1].startswith("arbiter-similarity")
    assert answer["diagnostics"]["q"]["similarities"] == pytest.approx(
        [embeddings.cosine(embedding_vector("s", 384), embedding_vector(f"option {i}: what option {i} is about", 384))
         for i in range(255)])


def test_similarity_work_takes_turns_across_projects(monkeypatch: pytest.MonkeyPatch) -> None:
    """One project's backlog on the similarity thread never stands in front of another's: the
    queue is served in turn per project, and a project past its bound is told to slow down."""
    queue = embeddings.FairQueue(2, "test-similarity")
    monkeypatch.setattr(embeddings, "SIMILARITY_THREAD", queue)
    monkeypatch.setattr(embeddings, "SIMILARITY_QUEUED_PER_PROJECT", 2)
    gate = threading.Event()

    row = embeddings.rows_of(Embedded([embedding_vector("s", 384)], [1]))[0]
    big = [(row, [row] * 200)]  # past OFF_LOOP_WORK: it goes to the thread

    def blocking(pairs: Any, pause: bool = False) -> list[list[float]]:
        gate.wait(5)
        return [[0.0] * len(rows) for _, rows in pairs]

    monkeypatch.setattr(embeddings, "similarities", blocking)

    async def run() -> list[str]:
        done: list[str] = []

        async def one(project: str) -> None:
            await embeddings.similarities_off_loop(big, project)
            done.append(project)

        tasks = [asyncio.create_task(one("a")) for _ in range(3)]  # one runs, two wait: a's bound
        await asyncio.sleep(0.05)
        with pytest.raises(RateLimited) as refused:
            await embeddings.similarities_off_loop(big, "a")
        assert refused.value.status == 429 and refused.value.headers["Retry-After"] == "1"
        tasks.append(asyncio.create_task(one("b")))  # b's one call: next after a's running one
        await asyncio.sleep(0.05)
        gate.set()
        await asyncio.gather(*tasks)
        return done

    assert asyncio.run(run()) == ["a", "b", "a", "a"]
    queue.close()


def test_a_text_cut_to_the_models_window_is_said_in_the_diagnostics() -> None:
    class Cutting(Counting):
        async def embed(self, texts: Sequence[str], role: Role) -> Embedded:
            found = await super().embed(texts, role)
            return Embedded(found.vectors, found.tokens, [role == "query" or t.startswith("long") for t in texts])

    body = {"state": "a very long state", "questions": {
        "q": {"type": "choice", "criteria": {"short": None, "long": "x"}},
        "r": {"type": "score", "criteria": ["long one", "long two"]}}}
    answer = asyncio.run(embeddings.decide(body, Cutting(), embeddings.PassageCache()))
    (first,) = answer["diagnostics"]["q"]["warnings"]
    assert first["code"] == "truncated" and first["message"].startswith(
        "the state (with the instructions) and 1 option text were longer than the model's window")
    assert answer["diagnostics"]["r"]["warnings"][0]["message"].startswith("the state (with the instructions) "
                                                                           "and 2 option texts were")
    plain = asyncio.run(embeddings.decide(body, Counting(), embeddings.PassageCache()))
    assert "warnings" not in plain["diagnostics"]["q"]


class CountingModel:
    """A ModelEmbedder over the emulators' vectors that records what it was asked."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], Role]] = []

    async def embed_with(self, options: CallOptions, texts: Sequence[str], role: Role) -> Embedded:
        self.calls.append((list(texts), role))
        return Embedded([embedding_vector(t) for t in texts], [len(t.split()) for t in texts])

    async def aclose(self) -> None:
        return None


class Inner:
    kind, url = "openai", "http://127.0.0.1:9"
