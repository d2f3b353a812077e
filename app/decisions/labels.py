"""Label reading: any generation model answers System One questions (issue 10).

Each question is one read. The prompt is the state (a string as-is, anything
else as compact JSON), then the question's instructions and its options, each
with a one-token label (``A``..``Z`` for a choice, in request order; ``yes`` /
``no`` for a noul; ``0``..``9`` for score levels), then an instruction to
answer with one label. The reply is prefilled so that the label is the very
next token; the reader returns the log-probabilities of the label tokens at
that position, and softmax over them gives the answer's probabilities.

The answer has the shape the vLLM emulator gives (``answers.vllm_answer``):
``confidence`` is the chosen option's share of the labels times
``label_mass``, the probability the model put on the labels at all.

Pure domain code: the thing that reads logprobs is a ``LabelReader``
(``infra_adapters.openai_logprobs`` speaks OpenAI-compatible chat completions).
"""

from __future__ import annotations

import asyncio
import math
import string
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import orjson

from app.errors import InvalidRequest

CHOICE_LABELS = tuple(string.ascii_uppercase)
NOUL_LABELS = ("yes", "no")
SCORE_LABELS = tuple(string.digits)
PREFILL = "Answer:"
INSTRUCTION = "Answer with one label only:"


class LabelRead(Protocol):
    """What one read gives: the labels' logprobs at the reply's first position.

    ``logprobs`` holds only the labels the reader could read exactly; a label
    missing from it makes the question unanswerable (a 400).
    """

    @property
    def logprobs(self) -> Mapping[str, float]: ...

    @property
    def label_mass(self) -> float:
        """Sum of exp(logprob) over the labels: their probability over the whole vocabulary."""
        ...

    @property
    def input_tokens(self) -> int: ...

    @property
    def cached_tokens(self) -> int:
        """Of ``input_tokens``, those the backend read from its prefix cache (0 when it does not say)."""
        ...

    @property
    def argmax_is_label(self) -> bool:
        """The most probable token of the whole vocabulary is a label."""
        ...


class LabelReader(Protocol):
    """Reads the first-token logprobs of ``labels`` after ``messages`` (the reply prefilled)."""

    async def read(self, messages: list[dict[str, Any]], labels: Sequence[str],
                   token_ids: Sequence[Sequence[int]] | None = None) -> LabelRead:
        """``token_ids``: per label, in order, the ids of its one-token spellings (``spellings``;
        the label as written first), when the model's tokenizer is known."""
        ...


# -- prompts -------------------------------------------------------------------


def content_text(value: Any) -> str:
    """A state or instructions value as prompt text: a string as-is, anything else compact JSON."""
    if isinstance(value, str):
        return value
    return orjson.dumps(value).decode()


def labels_for(qid: str, question: Mapping[str, Any]) -> tuple[str, ...]:
    """The labels of a question's options, in order (a choice over 26 options is a 400)."""
    qtype = question["type"]
    if qtype == "noul":
        return NOUL_LABELS
    criteria = question["criteria"]
    if qtype == "score":
        if len(criteria) > len(SCORE_LABELS):
            raise InvalidRequest(f"questions.{qid}: a score read by labels has at most "
                                 f"{len(SCORE_LABELS)} levels, not {len(criteria)}")
        return SCORE_LABELS[:len(criteria)]
    if len(criteria) > len(CHOICE_LABELS):
        raise InvalidRequest(
            f"questions.{qid}: this model reads choices by labels A to Z, so a choice has at most "
            f"{len(CHOICE_LABELS)} options, not {len(criteria)}; the question cannot be split over "
            "several reads, since softmaxes over different subsets of options cannot be compared")
    return CHOICE_LABELS[:len(criteria)]


def option_lines(question: Mapping[str, Any], labels: Sequence[str]) -> list[str]:
    qtype = question["type"]
    criteria: Any = question.get("criteria")
    if qtype == "choice":
        return [f"{label}: {name}" + (f" - {desc}" if desc is not None else "")
                for label, (name, desc) in zip(labels, criteria.items())]
    if qtype == "score":
        return [f"{label}: {level}" for label, level in zip(labels, criteria)]
    criteria = criteria or {}
    return [f"{label}" + (f": {criteria[key]}" if key in criteria else "")
            for label, key in zip(labels, ("true", "false"))]


def prompt_text(state: Any, question: Mapping[str, Any], labels: Sequence[str]) -> str:
    """The user message of one read: the state first, so every read of a request shares a prefix."""
    parts = [content_text(state), ""]
    instructions = question.get("instructions")
    if instructions is not None:
        parts.append(content_text(instructions))
    parts.append("Options:")
    parts.extend(option_lines(question, labels))
    parts.append(f"{INSTRUCTION} {', '.join(labels)}.")
    return "\n".join(parts)


def messages_for(state: Any, question: Mapping[str, Any], labels: Sequence[str]) -> list[dict[str, Any]]:
    """The chat of one read: the prompt, and the assistant's reply prefilled up to the label."""
    return [{"role": "user", "content": prompt_text(state, question, labels)},
            {"role": "assistant", "content": PREFILL}]


def spellings(label: str) -> tuple[str, str]:
    """The ways a label can come as the reply's first token: as written, and after ``Answer:`` with
    the leading space a BPE or SentencePiece tokenizer folds into the token (`` A``, ``ĠA``, ``▁A``)."""
    return label, " " + label


def label_token_ids(qid: str, labels: Sequence[str],
                    token_ids: Mapping[str, Sequence[int]] | None) -> list[list[int]] | None:
    """Per label, the ids of its one-token spellings, from the model's tokenizer (``token_ids``:
    spelling -> its tokens); a label that is not one token as written is a 400."""
    if token_ids is None:
        return None
    found: list[list[int]] = []
    for label in labels:
        tokens = list(token_ids.get(label, ()))
        if len(tokens) != 1:
            raise InvalidRequest(
                f"questions.{qid}: the label {label!r} is not a single token for this model "
                f"(token ids {tokens}), so it cannot be read as the reply's first token")
        ids = [int(tokens[0])]
        for spelling in spellings(label)[1:]:
            tokens = list(token_ids.get(spelling, ()))
            # Two tokens (a space, then the label) is no spelling of the label's; one token may be
            # the label's own id (a SentencePiece tokenizer adds the space to both).
            if len(tokens) == 1 and int(tokens[0]) not in ids:
                ids.append(int(tokens[0]))
        found.append(ids)
    return found


def refuse_thinking(body: Mapping[str, Any]) -> None:
    """Thinking is always off in a read (vLLM gets ``enable_thinking: false``): the label is the
    reply's first token, where a thinking model would start its reasoning. A request that turns it
    on is a 400, not silently read without it; the template's other kwargs have no effect."""
    kwargs = body.get("chat_template_kwargs")
    if isinstance(kwargs, Mapping) and kwargs.get("enable_thinking") not in (None, False):
        raise InvalidRequest(
            "chat_template_kwargs.enable_thinking: this model answers decisions by label reading, which "
            "reads the label as the reply's first token, where thinking would start; thinking is always "
            "off, so leave enable_thinking out or send false")


# -- answers -------------------------------------------------------------------


def softmax(logprobs: Sequence[float]) -> list[float]:
    top = max(logprobs)
    exps = [math.exp(x - top) for x in logprobs]
    total = math.fsum(exps)
    return [e / total for e in exps]


def answer_from_read(qid: str, question: Mapping[str, Any], labels: Sequence[str],
                     read: LabelRead) -> tuple[dict[str, Any], dict[str, Any]]:
    """One System One answer and its diagnostics entry, from the labels' logprobs."""
    missing = [label for label in labels if label not in read.logprobs]
    if missing:
        raise InvalidRequest(
            f"questions.{qid}: the label(s) {', '.join(missing)} cannot be read exactly: the backend "
            "did not return their logprobs (they fell out of top_logprobs and it takes no "
            "logprob_token_ids)")
    probs = softmax([read.logprobs[label] for label in labels])
    best = 0
    for i, p in enumerate(probs):
        if p > probs[best]:
            best = i
    confidence = min(1.0, max(0.0, probs[best] * read.label_mass))
    diagnostics = {"label_mass": read.label_mass, "argmax_is_label": read.argmax_is_label}
    qtype = question["type"]
    if qtype == "noul":
        return {"type": "noul", "noul": probs[0], "probabilities": {"yes": probs[0], "no": probs[1]},
                "confidence": confidence}, diagnostics
    if qtype == "choice":
        names = list(question["criteria"])
        return {"type": "choice", "choice": names[best], "probabilities": dict(zip(names, probs)),
                "confidence": confidence}, diagnostics
    return {"type": "score", "score": math.fsum(i * p for i, p in enumerate(probs)),
            "legend": {str(i): level for i, level in enumerate(question["criteria"])},
            "probabilities": {str(i): p for i, p in enumerate(probs)},
            "confidence": confidence}, diagnostics


async def decide(body: Mapping[str, Any], reader: LabelReader,
                 token_ids: Mapping[str, Sequence[int]] | None = None) -> dict[str, Any]:
    """``answers``, ``usage`` and ``diagnostics`` for a System One request already validated
    (``app.decisions.schema.validate``). ``token_ids``: every spelling of every label (``spellings``)
    -> its tokens, when the model's tokenizer is known. Every question is checked before any read
    is sent."""
    refuse_thinking(body)
    state = body["state"]
    questions: Mapping[str, Mapping[str, Any]] = body["questions"]
    plans = []
    for qid, question in questions.items():
        labels = labels_for(qid, question)
        plans.append((qid, question, labels, label_token_ids(qid, labels, token_ids)))
    tasks = [asyncio.ensure_future(reader.read(messages_for(state, question, labels), labels, ids))
             for _, question, labels, ids in plans]
    try:
        reads = await asyncio.gather(*tasks)
    except BaseException:  # one read failed (or the request was cancelled): the others stop too
        for task in tasks:
            task.cancel()
        raise
    answers: dict[str, Any] = {}
    diagnostics: dict[str, Any] = {}
    for (qid, question, labels, _), read in zip(plans, reads):
        answers[qid], diagnostics[qid] = answer_from_read(qid, question, labels, read)
    usage = {"input_tokens": sum(read.input_tokens for read in reads), "output_tokens": len(reads),
             "input_tokens_details": {"cached_tokens": sum(read.cached_tokens for read in reads)}}
    return {"answers": answers, "usage": usage, "diagnostics": diagnostics}
