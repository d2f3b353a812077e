"""The OpenAPI description of the lean routes' bodies (they never reach FastAPI, so it cannot
infer them). Documentation and fuzzing use it; the validation itself is app/decisions/schema.py.

The answer's models document only: the backend's JSON is forwarded as it came (SPEC §1, only
``model`` rewritten), so nothing here ever validates or re-serialises it, and what a backend
sends beyond these fields passes through (``extra="allow"``: the schema says so).
app/api/public/lean_openapi.py puts them on the routes."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

_CONTENT = {"oneOf": [{"type": "string"}, {"type": "object"}, {"type": "array"}, {"type": "null"}]}
_ANY = {"description": "any JSON value; the backend shows a non-string its own way"}
_MEDIA = {"type": "array", "items": {"type": "string"}, "description": "base64 strings or data: URLs"}

QUESTION: dict[str, Any] = {
    "type": "object",
    "required": ["type"],
    "properties": {
        "type": {"type": "string", "enum": ["choice", "noul", "score"]},
        "instructions": _ANY,
        "criteria": {"oneOf": [
            {"type": "object", "minProperties": 1, "maxProperties": 255,
             "additionalProperties": _ANY, "description": "choice: option -> description"},
            {"type": "object", "properties": {"true": _ANY, "false": _ANY},
             "additionalProperties": False, "description": "noul"},
            {"type": "array", "minItems": 2, "maxItems": 10, "items": {"not": {"type": "null"}},
             "description": "score: levels, lowest first"},
            {"type": "null"},
        ]},
    },
    "additionalProperties": True,
}

SYSTEMONE_REQUEST: dict[str, Any] = {
    "type": "object",
    "required": ["model", "state", "questions"],
    "properties": {
        "model": {"type": "string", "minLength": 1},
        "state": _CONTENT,
        "questions": {"type": "object", "minProperties": 1, "maxProperties": 64, "additionalProperties": QUESTION},
        "images": _MEDIA, "audio": _MEDIA, "videos": _MEDIA,
        "keep_alive": {"oneOf": [{"type": "number"}, {"type": "string"}]},
    },
    "additionalProperties": True,
}

CHAT_REQUEST: dict[str, Any] = {
    "type": "object",
    "required": ["model", "messages"],
    "properties": {
        "model": {"type": "string", "minLength": 1},
        "messages": {"type": "array", "items": {"type": "object"}},
        "stream": {"type": "boolean"},
    },
    "additionalProperties": True,
}


class _PassedOn(BaseModel):
    """Part of a backend's answer: its other fields come through as they are."""

    model_config = ConfigDict(extra="allow")


class ChoiceAnswer(_PassedOn):
    type: Literal["choice"]
    choice: str = Field(description="the most probable option's name")
    probabilities: dict[str, float] = Field(description="option name -> probability; sums to 1")
    confidence: float | None = Field(None, description="the backend's, 0 to 1 (docs/api.md: how each defines it)")


class NoulAnswer(_PassedOn):
    type: Literal["noul"]
    noul: float = Field(description="the probability that the statement is true, 0 to 1")
    probabilities: dict[str, float] | None = Field(
        None, description="yes and no (vLLM and Arbiter's read strategies; Ollama's native models leave it out)")
    confidence: float | None = None


class ScoreAnswer(_PassedOn):
    type: Literal["score"]
    score: float = Field(description="the expected level, sum(level * probability), 0 to levels - 1")
    legend: dict[str, Any] = Field(description="level index (\"0\" the lowest) -> the level as the request gave it")
    probabilities: dict[str, float] = Field(description="level index -> probability; sums to 1")
    confidence: float | None = None


Answer = Annotated[ChoiceAnswer | NoulAnswer | ScoreAnswer, Field(discriminator="type")]


class CachedTokens(_PassedOn):
    cached_tokens: int = Field(description="of input_tokens, those read from a prefix cache kept to this caller")


class Usage(_PassedOn):
    input_tokens: int
    output_tokens: int
    input_tokens_details: CachedTokens | None = None


class AnswerWarning(BaseModel):
    """A reading that clearly failed: the answer stands, treat it with doubt."""

    code: str = Field(description="stable and machine-readable: low_label_mass")
    message: str = Field(description="for people")


class QuestionDiagnostics(_PassedOn):
    """How one question was read (vLLM and Arbiter's read strategies; Ollama's native models send none)."""

    label_mass: float | None = Field(None, description="the probability the model put on the labels at all")
    argmax_is_label: bool | None = None
    bounded_labels: list[str] | None = Field(None, description="labels missing from the backend's top logprobs")
    similarities: list[float] | None = Field(None, description="each option's cosine similarity (embeddings)")
    warnings: list[AnswerWarning] | None = Field(None, description="present only when the reading clearly failed")


class SystemOneAnswer(_PassedOn):
    """The backend's answer as it came, with ``model`` set to the name the caller used
    (docs/api.md shows one per backend kind)."""

    model: str
    answers: dict[str, Answer] = Field(description="one per question, in the request's order")
    usage: Usage | None = None
    diagnostics: dict[str, QuestionDiagnostics] | None = Field(None, description="by question")
    id: str | None = Field(None, description="vLLM's own, passed through (so are object, created and joint)")
    object: str | None = None
    created: int | None = None
