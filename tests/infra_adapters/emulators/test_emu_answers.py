"""The shared answer maths: determinism and coherence, without HTTP."""

from __future__ import annotations

import math
from typing import Any

import pytest

from infra_adapters.emulators.answers import (
    count_tokens,
    distribution,
    ollama_answer,
    usage,
    vllm_answer,
)

STATES: list[Any] = ["Checkout returns 500 errors.", {"ticket": "charged twice"}, [1, 2], None]


def _questions() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for n in (1, 2, 3, 7, 26):
        out.append({"type": "choice", "criteria": {f"opt{i}": None for i in range(n)}})
    for n in (2, 5, 10):
        out.append({"type": "score", "criteria": [f"level {i}" for i in range(n)]})
    out.append({"type": "noul"})
    out.append({"type": "noul", "instructions": "Is it urgent?", "criteria": {"true": "yes"}})
    return out


def test_same_inputs_same_distribution_and_inputs_matter() -> None:
    q: dict[str, Any] = {
        "type": "choice",
        "instructions": "Which?",
        "criteria": {"a": None, "b": "x", "c": None},
    }
    first = distribution("s", q["type"], q["instructions"], q["criteria"])
    again = distribution("s", q["type"], q["instructions"], q["criteria"])
    assert first == again
    others = [
        distribution("s2", q["type"], q["instructions"], q["criteria"]),
        distribution("s", q["type"], "Which one?", q["criteria"]),
        distribution("s", q["type"], q["instructions"], {"a": None, "b": "y", "c": None}),
    ]
    assert all(o.probs != first.probs for o in others)


def test_dict_key_order_of_the_state_does_not_matter() -> None:
    crit = ["low", "high"]
    a = distribution({"x": 1, "y": 2}, "score", None, crit)
    b = distribution({"y": 2, "x": 1}, "score", None, crit)
    assert a == b


@pytest.mark.parametrize("state", STATES)
def test_ollama_answers_are_coherent(state: Any) -> None:
    for q in _questions():
        answer = ollama_answer(state, q)
        assert answer["type"] == q["type"]
        if q["type"] == "noul":
            assert set(answer) == {"type", "noul"}
            assert 0.0 <= answer["noul"] <= 1.0
            continue
        probs = answer["probabilities"]
        assert abs(math.fsum(probs.values()) - 1.0) < 1e-9
        assert all(0.0 <= p <= 1.0 for p in probs.values())
        values = list(probs.values())
        n = len(values)
        entropy = -math.fsum(p * math.log(p) for p in values if p > 0)
        expected_conf = 1.0 - entropy / math.log(n) if n > 1 else 1.0
        assert answer["confidence"] == pytest.approx(expected_conf, abs=1e-9)
        assert 0.0 <= answer["confidence"] <= 1.0
        if q["type"] == "choice":
            assert list(probs) == list(q["criteria"])
            assert answer["choice"] == max(probs, key=lambda k: probs[k])
        else:
            assert list(probs) == [str(i) for i in range(n)]
            assert answer["legend"] == {str(i): lvl for i, lvl in enumerate(q["criteria"])}
            assert answer["score"] == pytest.approx(sum(i * p for i, p in enumerate(values)))
            assert 0.0 <= answer["score"] <= n - 1


@pytest.mark.parametrize("state", STATES)
def test_vllm_answers_are_coherent(state: Any) -> None:
    for q in _questions():
        answer, diag = vllm_answer(state, q)
        assert diag["argmax_is_label"] is True
        assert 0.8 <= diag["label_mass"] <= 1.0
        probs = answer["probabilities"]
        assert abs(math.fsum(probs.values()) - 1.0) < 1e-9
        chosen = max(probs.values())
        assert answer["confidence"] == pytest.approx(chosen * diag["label_mass"], abs=1e-12)
        assert 0.0 <= answer["confidence"] <= 1.0
        if q["type"] == "noul":
            assert list(probs) == ["yes", "no"]
            assert answer["noul"] == probs["yes"]
        elif q["type"] == "choice":
            assert answer["choice"] == max(probs, key=lambda k: probs[k])
        else:
            expected = sum(int(k) * p for k, p in probs.items())
            assert answer["score"] == pytest.approx(expected)


def test_both_backends_draw_the_same_probabilities() -> None:
    q = {"type": "choice", "criteria": {"a": None, "b": None, "c": None}}
    o = ollama_answer("state", q)
    v, _ = vllm_answer("state", q)
    assert o["probabilities"] == v["probabilities"]
    assert o["choice"] == v["choice"]


def test_ties_go_to_the_first_option() -> None:
    d = distribution("s", "choice", None, {"a": None, "b": None})
    object.__setattr__(d, "probs", [0.5, 0.5])
    assert d.argmax == 0
    assert d.entropy_confidence() == pytest.approx(0.0)


def test_usage_counts_text_and_questions() -> None:
    assert count_tokens("Hello, world!") == 4
    questions: dict[str, dict[str, Any]] = {
        "a": {"type": "noul", "instructions": "Is it urgent?"},
        "b": {"type": "choice", "criteria": {"x": "an x", "y": None}},
    }
    first = usage("My card was charged.", questions)
    assert first["output_tokens"] == 2
    # one read per question: the state is counted once per question
    assert first["input_tokens"] > 2 * count_tokens("My card was charged.")
    renamed = {"other": questions["a"], "ids": questions["b"]}
    assert usage("My card was charged.", renamed) == first
    longer = usage("My card was charged twice, yesterday.", questions)
    assert longer["input_tokens"] > first["input_tokens"]
