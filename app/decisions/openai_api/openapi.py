"""The OpenAPI description of ``POST /v1/decisions`` (a lean route: FastAPI cannot infer it).
The rules themselves are ``request.validate``; this is for documentation and fuzzing. The
answer's and the error's models document only: nothing validates or re-serialises an answer
(a vLLM's own passes through with only ``model`` rewritten, its other fields kept)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

_TEXT_PART = {"type": "object", "required": ["type", "text"],
              "properties": {"type": {"const": "input_text"}, "text": {"type": "string"}}}
_TEXT = {"oneOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": _TEXT_PART}]}
# Any other JSON value (but null) is asked as its compact JSON text.
_STRUCTURED = {"anyOf": [_TEXT, {"not": {"type": "null"}}]}
_DESCRIPTION = {"description": "any JSON value; a non-string is asked as its compact JSON text"}
_NAMED = {"name": {"type": "string"}, "instructions": _STRUCTURED}

QUESTION: dict[str, Any] = {"oneOf": [
    {"type": "object", "required": ["type", "instructions"], "additionalProperties": False,
     "properties": {"type": {"const": "predicate"}, **_NAMED}},
    {"type": "object", "required": ["type", "instructions", "choices"], "additionalProperties": False,
     "properties": {"type": {"const": "choice"}, **_NAMED, "choices": {
         "type": "array", "minItems": 2, "maxItems": 255, "items": {
             "type": "object", "required": ["value"], "additionalProperties": False,
             "properties": {"value": {"type": ["string", "boolean"]}, "description": _DESCRIPTION}}}}},
    {"type": "object", "required": ["type", "instructions", "levels"], "additionalProperties": False,
     "properties": {"type": {"const": "score"}, **_NAMED, "levels": {
         "type": "array", "minItems": 2, "maxItems": 10, "items": {
             "type": "object", "required": ["label"], "additionalProperties": False,
             "properties": {"label": {"type": "string"}, "description": _DESCRIPTION}}}}},
]}

REQUEST: dict[str, Any] = {
    "type": "object",
    "required": ["model", "input", "questions"],
    "additionalProperties": False,
    "properties": {
        "model": {"type": "string", "minLength": 1},
        "input": {"oneOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["role", "content"], "additionalProperties": False,
            "properties": {"type": {"const": "message"}, "role": {"const": "user"}, "content": _TEXT}}}]},
        "questions": {"type": "array", "minItems": 1, "maxItems": 64, "items": QUESTION},
        "safety_identifier": {"type": ["string", "null"], "maxLength": 64},
        "prompt_cache_key": {"type": ["string", "null"]},
        "prompt_cache_options": {"type": ["object", "null"]},
    },
}

class _PassedOn(BaseModel):
    model_config = ConfigDict(extra="allow")


class DecisionPredicate(_PassedOn):
    type: Literal["predicate"]
    name: str | None = Field(description="the question's name, null for an unnamed one")
    probability: float = Field(description="that the statement is true, 0 to 1")


class ChoiceProbability(_PassedOn):
    value: str | bool
    probability: float


class DecisionChoice(_PassedOn):
    type: Literal["choice"]
    name: str | None
    choice: str | bool = Field(description="the winning value, with its JSON type")
    confidence: float = Field(description="the backend's, 0 to 1")
    probabilities: list[ChoiceProbability] = Field(description="in the request's order")


class LevelProbability(_PassedOn):
    value: int = Field(description="the level's zero-based index")
    label: str
    probability: float


class DecisionScore(_PassedOn):
    type: Literal["score"]
    name: str | None
    score: float = Field(description="the probability-weighted average of the zero-based level indices")
    confidence: float
    probabilities: list[LevelProbability]


class InputTokensDetails(_PassedOn):
    cached_tokens: int
    cache_write_tokens: int


class OutputTokensDetails(_PassedOn):
    reasoning_tokens: int


class DecisionUsage(_PassedOn):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class DecisionAnswer(_PassedOn):
    """OpenAI's Decision object, as the SDK parses it (docs/api.md)."""

    model: str = Field(description="the name the caller used")
    answers: list[Annotated[DecisionPredicate | DecisionChoice | DecisionScore, Field(discriminator="type")]] = Field(
        description="one per question, in the request's order")
    usage: DecisionUsage


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str = Field(description="the error_type: invalid_request_error, authentication_error, ..., backend_error")
    param: str | None = Field(description="the offending parameter (questions[0].choices[1].value), if any")
    code: str | None = Field(description="a finer reason (unknown_parameter, rate_limit_exceeded, ...) or null")


class OpenAIError(BaseModel):
    """Every error on /v1/decisions, Arbiter's or a backend's: OpenAI's shape, which its SDK parses."""

    error: OpenAIErrorDetail
