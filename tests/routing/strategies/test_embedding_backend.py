"""`read_strategy: embeddings` end to end through /v1/systemone: an embedding model answers
decisions by cosine similarity, over Ollama's /api/embed and an OpenAI-compatible /v1/embeddings
(vLLM's), with the passages embedded once per model and the temperature set per model."""

from __future__ import annotations

import math
from typing import Any

import pytest

from app.routing.strategies import embeddings
from infra_adapters.emulators.answers import count_tokens
from infra_adapters.emulators.generation import embedding_vector
from infra_adapters.emulators.ollama_state import OllamaState
from infra_adapters.emulators.vllm import VllmState
from tests.support import Stack, assert_error, decision

NOMIC = "nomic-embed-text"
E5 = "intfloat/multilingual-e5-small"
TICKET = {"ticket": "My parcel never arrived and the courier tracking is stuck"}
TEAMS = {"billing": "payments invoices refunds", "shipping": "parcel deliveries courier tracking",
         "technical": None}


def _model(stack: Stack, name: str) -> dict[str, Any]:
    models = stack.client("admin").get("/admin/models").json()["data"]
    found = [m for m in models if m["public_name"] == name]
    assert found, [m["public_name"] for m in models]
    return found[0]


def _embeddings_on(stack: Stack, name: str, **extra: Any) -> dict[str, Any]:
    response = stack.client("admin").patch(f"/admin/models/{_model(stack, name)['id']}",
                                           json={"read_strategy": "embeddings", **extra})
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def _ticket(model: str) -> dict[str, Any]:
    return decision(model, state=TICKET, questions={
        "team": {"type": "choice", "instructions": "Which team?", "criteria": TEAMS},
        "urgent": {"type": "noul", "instructions": "The customer is angry",
                   "criteria": {"true": "angry furious upset"}},
        "tone": {"type": "score", "criteria": ["calm", "stuck", "furious"]}})


@pytest.fixture
def ollama_embedder(stack: Stack) -> Stack:
    state: OllamaState = stack.ollama_state
    state.models["nomic-embed-text"] = ["embedding"]
    assert stack.client("admin").post("/admin/services/ollama/refresh").status_code == 200
    return stack


def _embed_calls(state: OllamaState | VllmState, path: str, since: int) -> list[dict[str, Any]]:
    return [r.json for r in state.requests[since:] if r.path == path]


def test_an_ollama_embedding_model_answers_by_similarity(ollama_embedder: Stack) -> None:
    stack, state = ollama_embedder, ollama_embedder.ollama_state
    view = _embeddings_on(stack, NOMIC)
    assert view["read_strategy"] == "embeddings" and "decision" in view["capabilities"]
    before = len(state.requests)
    response = stack.client().post("/v1/systemone", json=_ticket(NOMIC))
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["model"] == NOMIC and list(answer["answers"]) == ["team", "urgent", "tone"]
    team = answer["answers"]["team"]
    assert team["choice"] == "shipping" and list(team["probabilities"]) == list(TEAMS)
    assert team["confidence"] == pytest.approx(team["probabilities"]["shipping"])
    for qid, item in answer["answers"].items():
        assert math.isclose(sum(item["probabilities"].values()), 1.0, rel_tol=1e-9), qid
        assert answer["diagnostics"][qid]["label_mass"] == 1
    assert answer["answers"]["tone"]["score"] == pytest.approx(
        sum(int(k) * p for k, p in answer["answers"]["tone"]["probabilities"].items()))
    assert answer["answers"]["tone"]["legend"] == {"0": "calm", "1": "stuck", "2": "furious"}

    calls = _embed_calls(state, "/api/embed", before)
    assert "/v1/systemone" not in [r.path for r in state.requests[before:]]
    # nomic wants its task prefixes; the queries are one batch, the passages not cached another each.
    query = "search_query: Which team?\n" + '{"ticket": "My parcel never arrived and the courier tracking is stuck"}'
    assert calls[0]["input"][0] == query and calls[0]["truncate"] is False
    passages = [text for call in calls[1:] for text in call["input"]]
    assert "search_document: shipping: parcel deliveries courier tracking" in passages
    assert "search_document: technical" in passages  # no description: the name alone
    assert "search_document: not: angry furious upset" in passages  # a noul without 'false'
    # usage counts every text embedded for the answer, as the backend counted them
    embedded = sum(count_tokens(text) for call in calls for text in call["input"])
    assert answer["usage"]["input_tokens"] == embedded and answer["usage"]["output_tokens"] == 0


def test_passages_are_embedded_once_per_model(ollama_embedder: Stack) -> None:
    stack, state = ollama_embedder, ollama_embedder.ollama_state
    _embeddings_on(stack, NOMIC)
    first = stack.client().post("/v1/systemone", json=_ticket(NOMIC)).json()
    before = len(state.requests)
    other = _ticket(NOMIC) | {"state": {"ticket": "I was charged twice, please refund"}}
    second = stack.client().post("/v1/systemone", json=other)
    assert second.status_code == 200, second.text
    calls = _embed_calls(state, "/api/embed", before)
    assert len(calls) == 1 and all(text.startswith("search_query: ") for text in calls[0]["input"])
    assert second.json()["answers"]["team"]["choice"] == "billing"
    # usage still counts the cached passages: it never tells whether someone asked them before
    passages = first["usage"]["input_tokens"] - sum(count_tokens(t) for t in _first_queries(state))
    queries = sum(count_tokens(t) for t in calls[0]["input"])
    assert second.json()["usage"]["input_tokens"] == queries + passages


def _first_queries(state: OllamaState) -> list[str]:
    calls = [r.json for r in state.requests if r.path == "/api/embed"]
    return list(calls[0]["input"])


def test_the_temperature_is_set_per_model(ollama_embedder: Stack) -> None:
    stack = ollama_embedder
    _embeddings_on(stack, NOMIC)
    default = stack.client().post("/v1/systemone", json=_ticket(NOMIC)).json()
    sims = default["diagnostics"]["team"]["similarities"]
    expected = embeddings.probabilities(sims, embeddings.DEFAULT_TEMPERATURE)
    assert list(default["answers"]["team"]["probabilities"].values()) == pytest.approx(expected)

    view = _embeddings_on(stack, NOMIC, embedding_temperature=0.5)
    assert view["embedding_temperature"] == 0.5
    warm = stack.client().post("/v1/systemone", json=_ticket(NOMIC)).json()
    assert list(warm["answers"]["team"]["probabilities"].values()) == pytest.approx(
        embeddings.probabilities(sims, 0.5))
    assert warm["answers"]["team"]["confidence"] < default["answers"]["team"]["confidence"]
    refused = stack.client("admin").patch(f"/admin/models/{view['id']}", json={"embedding_temperature": 0})
    assert_error(refused, 400)


def test_questions_it_cannot_answer_are_400s(ollama_embedder: Stack) -> None:
    stack = ollama_embedder
    _embeddings_on(stack, NOMIC)
    bare = decision(NOMIC, questions={"q": {"type": "noul"}})
    response = stack.client().post("/v1/systemone", json=bare)
    assert_error(response, 400, "invalid_request_error")
    assert "questions.q" in response.json()["error"]
    llama = _model(stack, "llama3.2")
    wrong = stack.client("admin").patch(f"/admin/models/{llama['id']}", json={"read_strategy": "embeddings"})
    assert_error(wrong, 400)
    assert "embedding model" in wrong.json()["error"]


@pytest.mark.parametrize(("field", "item"), [("images", "iVBORw0KGgo="), ("audio", "UklGRg=="),
                                            ("videos", "data:video/mp4;base64,AAAA")])
def test_media_are_400s_even_where_the_model_lists_the_capability(stack: Stack, field: str, item: str) -> None:
    """Similarity reads text only: a model whose service says it takes media still refuses them
    (the strategy's own check, behind the forwarder's capability check), whatever the media field."""
    stack.ollama_state.models[NOMIC] = ["embedding", "vision", "audio", "video"]
    assert stack.client("admin").post("/admin/services/ollama/refresh").status_code == 200
    _embeddings_on(stack, NOMIC)
    before = len(stack.ollama_state.requests)
    response = stack.client().post("/v1/systemone", json={**_ticket(NOMIC), field: [item]})
    assert_error(response, 400, "invalid_request_error")
    assert f"reads text only; it cannot take {field}" in response.json()["error"]
    assert _embed_calls(stack.ollama_state, "/api/embed", before) == []


def test_an_openai_compatible_embedding_model_answers_by_similarity(vllm_stack: Stack) -> None:
    state: VllmState = vllm_stack.extra["state"]
    state.models[E5] = {"task": "embed", "max_model_len": 512}
    admin = vllm_stack.client("admin")
    added = admin.post("/admin/services/vllm/models", json={"model": E5, "capabilities": ["embedding"]})
    assert added.status_code == 201, added.text
    _wait_installed(vllm_stack, E5)
    _embeddings_on(vllm_stack, E5)
    before = len(state.requests)
    response = vllm_stack.client().post("/v1/systemone", json=_ticket(E5))
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["answers"]["team"]["choice"] == "shipping"
    calls = _embed_calls(state, "/v1/embeddings", before)
    assert calls and all(call["encoding_format"] == "float" and call["model"] == E5 for call in calls)
    # e5 wants "query: " and "passage: "
    assert all(text.startswith("query: ") for text in calls[0]["input"])
    assert all(text.startswith("passage: ") for call in calls[1:] for text in call["input"])
    query = calls[0]["input"][0]
    shipping = embedding_vector("passage: shipping: parcel deliveries courier tracking")
    assert answer["diagnostics"]["team"]["similarities"][1] == pytest.approx(
        sum(a * b for a, b in zip(embedding_vector(query), shipping)))


def _wait_installed(stack: Stack, name: str) -> None:
    from tests.support import wait_for

    wait_for(lambda: any(m["public_name"] == name for m in stack.client("admin").get("/admin/models").json()["data"]))
