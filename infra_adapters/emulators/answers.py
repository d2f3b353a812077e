"""Deterministic answer maths shared by the Ollama and vLLM emulators.

The answer to one question is a pure function of (state, question type,
instructions, criteria): never of the question's id nor of the other questions
in the request. Both emulators draw the same probabilities for the same
question; they differ only in `confidence` and in the answer's extra fields.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

QUESTION_TYPES = ("choice", "noul", "score")
# Tokens counted per question on top of its text: the prompt's fixed scaffolding.
QUESTION_OVERHEAD_TOKENS = 8
_TOKEN_RE = re.compile(r"\w+|[^\w\s]")


def canonical_json(value: Any) -> bytes:
    """Compact JSON with sorted keys (falls back to `json` for huge integers)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except (orjson.JSONEncodeError, TypeError):
        return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()


def question_digest(state: Any, qtype: str, instructions: Any, criteria: Any) -> bytes:
    """sha256 over the canonical JSON of the inputs that define an answer."""
    payload = {"state": state, "type": qtype, "instructions": instructions, "criteria": criteria}
    return hashlib.sha256(canonical_json(payload)).digest()


def _unit(digest: bytes, label: str) -> float:
    """A deterministic number in [0, 1) derived from `digest` and `label`."""
    h = hashlib.sha256(digest + label.encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64


def option_names(qtype: str, criteria: Any) -> list[str]:
    """Answer keys in request order: option names, ["true", "false"] or level indices."""
    if qtype == "choice":
        return list(criteria)
    if qtype == "noul":
        return ["true", "false"]
    if qtype == "score":
        return [str(i) for i in range(len(criteria))]
    raise ValueError(f"unknown question type {qtype!r}")


def softmax(logits: list[float]) -> list[float]:
    top = max(logits)
    exps = [math.exp(x - top) for x in logits]
    total = math.fsum(exps)
    return [e / total for e in exps]


@dataclass(frozen=True)
class Distribution:
    """Probabilities over a question's options, plus the values derived from them."""

    qtype: str
    names: list[str]  # option names / "true","false" / "0".."n-1", in order
    probs: list[float]  # sums to 1 within 1e-12
    label_mass: float  # in [0.8, 1.0]: share of the vocabulary on the labels (vLLM)

    @property
    def argmax(self) -> int:
        """Index of the most probable option; ties go to the first in order."""
        best = 0
        for i, p in enumerate(self.probs):
            if p > self.probs[best]:
                best = i
        return best

    @property
    def by_name(self) -> dict[str, float]:
        return dict(zip(self.names, self.probs))

    @property
    def expectation(self) -> float:
        """Sum of i * p_i (the score of a score question)."""
        return math.fsum(i * p for i, p in enumerate(self.probs))

    def entropy_confidence(self) -> float:
        """Ollama's confidence: 1 - H / ln(n); 0 when uniform, 1 when certain."""
        n = len(self.probs)
        if n < 2:
            return 1.0
        h = -math.fsum(p * math.log(p) for p in self.probs if p > 0.0)
        return min(1.0, max(0.0, 1.0 - h / math.log(n)))

    def label_confidence(self, index: int | None = None) -> float:
        """vLLM's confidence: the chosen option's share of the labels times label_mass."""
        i = self.argmax if index is None else index
        return min(1.0, max(0.0, self.probs[i] * self.label_mass))


def distribution(state: Any, qtype: str, instructions: Any, criteria: Any) -> Distribution:
    """The deterministic distribution for one question."""
    digest = question_digest(state, qtype, instructions, criteria)
    names = option_names(qtype, criteria)
    # How peaked the distribution is varies from question to question.
    scale = 1.0 + 5.0 * _unit(digest, "scale")
    logits = [scale * (2.0 * _unit(digest, f"logit:{i}") - 1.0) for i in range(len(names))]
    probs = softmax(logits) if names else []
    label_mass = 0.8 + 0.2 * _unit(digest, "label_mass")
    return Distribution(qtype=qtype, names=names, probs=probs, label_mass=label_mass)


# -- answers in each backend's shape ----------------------------------------


def ollama_answer(state: Any, question: dict[str, Any]) -> dict[str, Any]:
    """One answer as Ollama's decision models give it."""
    qtype = question["type"]
    d = distribution(state, qtype, question.get("instructions"), question.get("criteria"))
    if qtype == "noul":
        return {"type": "noul", "noul": d.probs[0]}
    if qtype == "choice":
        return {
            "type": "choice",
            "choice": d.names[d.argmax],
            "probabilities": d.by_name,
            "confidence": d.entropy_confidence(),
        }
    return {
        "type": "score",
        "score": d.expectation,
        "legend": {str(i): level for i, level in enumerate(question["criteria"])},
        "probabilities": d.by_name,
        "confidence": d.entropy_confidence(),
    }


def vllm_answer(state: Any, question: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """One answer as vLLM's label reading gives it, and its diagnostics entry."""
    qtype = question["type"]
    d = distribution(state, qtype, question.get("instructions"), question.get("criteria"))
    diagnostics = {"label_mass": d.label_mass, "argmax_is_label": True}
    confidence = d.label_confidence()
    if qtype == "noul":
        p = d.probs[0]
        answer: dict[str, Any] = {
            "type": "noul",
            "noul": p,
            "probabilities": {"yes": p, "no": 1.0 - p},
            "confidence": confidence,
        }
    elif qtype == "choice":
        answer = {
            "type": "choice",
            "choice": d.names[d.argmax],
            "probabilities": d.by_name,
            "confidence": confidence,
        }
    else:
        answer = {
            "type": "score",
            "score": d.expectation,
            # question_types.py ScoreQuestion.answer: each level's Option name, str() of the level.
            "legend": {str(i): python_text(level) for i, level in enumerate(question["criteria"])},
            "probabilities": d.by_name,
            "confidence": confidence,
        }
    return answer, diagnostics


# -- token usage -------------------------------------------------------------


def text_of(value: Any) -> str:
    """The prompt text of a state or instructions value (JSON is written compactly)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return canonical_json(value).decode()


def compact_text(value: Any) -> str:
    """How Ollama shows an instructions or description value: a string as it is, anything else
    as compact JSON in the order it came (Arbiter's docs/api.md; Ollama's source has no
    decision endpoint to read)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    try:
        return orjson.dumps(value).decode()
    except (orjson.JSONEncodeError, TypeError):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def python_text(value: Any) -> str:
    """How vLLM 0.33 shows an instructions or description value: a string as it is, anything else
    as ``str()`` of what its JSON parser gave (``{'a': [1, True]}``; null instructions as "").
    vllm/entrypoints/openai/decisions/question_types.py ``build_question`` and each type's
    ``parse_options`` (``Option(str(name), None if desc is None else str(desc))``)."""
    if value is None:
        return ""
    return value if isinstance(value, str) else str(value)


Render = Callable[[Any], str]


def count_tokens(text: str) -> int:
    """A simple deterministic token count: words and single punctuation marks."""
    return len(_TOKEN_RE.findall(text))


def criteria_text(qtype: str, criteria: Any, render: Render = text_of) -> str:
    """The option names and descriptions of a question as ``render`` shows each value."""
    if criteria is None:
        return ""
    if qtype == "score" and isinstance(criteria, list):
        return "\n".join(render(level) for level in criteria)
    if isinstance(criteria, dict):
        parts: list[str] = []
        for name, desc in criteria.items():
            parts.append(str(name))
            if desc is not None:
                parts.append(render(desc))
        return "\n".join(parts)
    return render(criteria)


def question_tokens(state_tokens: int, question: dict[str, Any], preamble_tokens: int = 0,
                    render: Render = text_of) -> int:
    """Prompt tokens of one read: the state, the question's text (its instructions and
    descriptions as ``render`` shows them) and fixed overhead."""
    qtype = str(question.get("type"))
    return (
        state_tokens
        + preamble_tokens
        + count_tokens(render(question.get("instructions")))
        + count_tokens(criteria_text(qtype, question.get("criteria"), render))
        + QUESTION_OVERHEAD_TOKENS
    )


def usage(state: Any, questions: dict[str, dict[str, Any]], preamble: Any = None,
          render: Render = text_of) -> dict[str, int]:
    """`{"input_tokens", "output_tokens"}` for a request: one read per question."""
    state_tokens = count_tokens(text_of(state))
    preamble_tokens = count_tokens(text_of(preamble))
    total = sum(question_tokens(state_tokens, q, preamble_tokens, render) for q in questions.values())
    return {"input_tokens": total, "output_tokens": len(questions)}
