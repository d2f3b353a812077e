"""Label reading: any generation model answers System One questions (issue 10).

Each question is one read, written as vLLM 0.33's ``NextTokenStrategy`` writes it
(``vllm/entrypoints/openai/decisions/strategies.py`` and ``question_types.py``), so that one
model answers the same through this reader and through vLLM's own ``/v1/systemone``:

- the request's top-level ``instructions``, when given, as a system message;
- one user message: the state (a string as it is, anything else as ``json.dumps`` writes it,
  ``", "`` and ``": "`` between items, non-ASCII kept), a blank line, then the question:
  ``Question: <instructions>`` when it has instructions, one line per option with its label
  (``A: name - description`` for a choice, ``yes: description`` / ``no`` for a noul, ``0: level``
  for a score; an empty description adds nothing), and the type's reply instruction;
- the chat ends at the generation prompt (``add_generation_prompt``, thinking off), so the label
  is the reply's first token. Labels: ``A``..``Z`` for a choice, in request order; ``yes`` /
  ``no`` for a noul; ``0``..``9`` for score levels.

Instructions and descriptions may be any JSON value (SPEC §1). A string is shown as it is; anything
else as compact JSON (``compact_text``: ``{"a":[1,true]}``). vLLM's own reader writes such a value
with Python's ``str()`` of what it parsed (question_types.py ``build_question`` and each type's
``parse_options``: ``{'a': [1, True]}``), so on a vLLM backend the reader writes it that way too
(``vllm_text``), and one model still answers the same through both.

The reader returns the log-probabilities of the label tokens at that position; softmax over them
gives the answer's probabilities. The answer has vLLM's shape: ``confidence`` is the chosen
option's share of the labels times ``label_mass``, the probability the model put on the labels
at all.

Pure domain code: the thing that reads logprobs is a ``LabelReader``
(``infra_adapters.openai_logprobs`` speaks OpenAI-compatible chat completions).
"""

from __future__ import annotations

import asyncio
import json
import math
import string
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import orjson

from app.errors import InvalidRequest
from app.routing.strategies import answer_warnings, calibration

CHOICE_LABELS = tuple(string.ascii_uppercase)
NOUL_LABELS = ("yes", "no")
SCORE_LABELS = tuple(string.digits)
ALL_LABELS = (*CHOICE_LABELS, *NOUL_LABELS, *SCORE_LABELS)
# question_types.py: each type's reply_instruction.
REPLY_INSTRUCTIONS = {
    "choice": "Answer with the letter of one option only.",
    "noul": "Answer with yes or no only.",
    "score": "Answer with the number of one level only.",
}
# strategies.py ReadPromptRequest: thinking off, the prompt ends at the generation prompt.
CHAT_OPTIONS = {"add_generation_prompt": True, "continue_final_message": False}
# How a read shows an instructions or description value that is not a string.
ValueText = Callable[[Any], str]


class LabelRead(Protocol):
    """What one read gives: the labels' logprobs at the reply's first position.

    ``logprobs`` holds only the labels the reader could read; a label missing from it makes the
    question unanswerable (a 400). ``bounded`` names the labels whose logprob is an upper bound
    (the backend ranked them below its last reported token: Ollama reports at most 20)."""

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
    def argmax_is_label(self) -> bool | None:
        """The most probable token of the whole vocabulary is a label (None: not known)."""
        ...

    @property
    def bounded(self) -> Sequence[str]: ...


class LabelReader(Protocol):
    """Reads the first-token logprobs of ``labels`` after ``messages`` (the chat ends at the
    generation prompt)."""

    async def read(self, messages: list[dict[str, Any]], labels: Sequence[str],
                   token_ids: Sequence[Sequence[int]] | None = None,
                   template_kwargs: Mapping[str, Any] | None = None) -> LabelRead:
        """``token_ids``: per label, in order, the ids its reply's first token can be, when the
        model's tokenizer is known. ``template_kwargs``: the request's ``chat_template_kwargs``."""
        ...


# -- prompts -------------------------------------------------------------------


def _json_text(value: Any) -> str:
    """``json.dumps(value, ensure_ascii=False)`` as vLLM's ``state_text`` writes the state it parsed
    (``jsonbody`` keeps floats as ``orjson.Fragment``: written as the float vLLM would have read)."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k), ensure_ascii=False)}: {_json_text(v)}"
                               for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_json_text(v) for v in value) + "]"
    if isinstance(value, orjson.Fragment):  # vLLM parses the number, then writes Python's repr of it
        text = orjson.dumps(value).decode()
        return json.dumps(float(text)) if any(c in text for c in ".eE") else text
    return json.dumps(value, ensure_ascii=False)


def content_text(value: Any) -> str:
    """A state as prompt text: a string as-is, anything else JSON (vLLM's ``state_text``)."""
    if isinstance(value, str):
        return value
    return _json_text(value)


def compact_text(value: Any) -> str:
    """An instructions or description value as prompt text: a string as-is, anything else as
    compact JSON (no spaces, non-ASCII kept, numbers as the caller wrote them)."""
    if isinstance(value, str):
        return value
    return orjson.dumps(value).decode()


def vllm_text(value: Any) -> str:
    """An instructions or description value as vLLM 0.33 shows it: a string as-is, anything else
    ``str()`` of the value its JSON parser gave (question_types.py: ``{'a': 1.0, 'b': True}``)."""
    if isinstance(value, str):
        return value
    return str(_parsed(value))


class _Digits:
    """An integer too long for ``int()`` (Python's 4,300-digit limit), shown as its digits."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _parsed(value: Any) -> Any:
    """``value`` as Python's ``json.loads`` gives it (``jsonbody`` keeps numbers as Fragments)."""
    if isinstance(value, dict):
        return {k: _parsed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_parsed(v) for v in value]
    if isinstance(value, orjson.Fragment):
        text = orjson.dumps(value).decode()
        if any(c in text for c in ".eE"):
            return float(text)
        try:
            return int(text)
        except ValueError:
            return _Digits(text)
    return value


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


def _described(value: Any, text: ValueText) -> str | None:
    """A description as the prompt shows it; None (and "") show none (question_types.py)."""
    if value is None:
        return None
    return text(value) or None


def option_lines(question: Mapping[str, Any], labels: Sequence[str], text: ValueText = compact_text) -> list[str]:
    """question_types.py ``reply_line`` per type."""
    qtype = question["type"]
    criteria: Any = question.get("criteria")
    if qtype == "choice":
        lines = []
        for label, (name, desc) in zip(labels, criteria.items()):
            shown = _described(desc, text)
            lines.append(f"{label}: {name} - {shown}" if shown else f"{label}: {name}")
        return lines
    if qtype == "score":
        return [f"{label}: {text(level)}" for label, level in zip(labels, criteria)]
    criteria = criteria or {}
    lines = []
    for label, key in zip(labels, ("true", "false")):
        shown = _described(criteria.get(key), text)
        lines.append(f"{label}: {shown}" if shown else label)
    return lines


def question_text(question: Mapping[str, Any], labels: Sequence[str], text: ValueText = compact_text) -> str:
    """QuestionType.prompt: the heading (when there are instructions), the options, the reply
    instruction."""
    body = "\n".join([*option_lines(question, labels, text), REPLY_INSTRUCTIONS[question["type"]]])
    instructions = question.get("instructions")
    heading = "" if instructions is None else text(instructions)
    return f"Question: {heading}\n{body}" if heading else body


def prompt_text(state: Any, question: Mapping[str, Any], labels: Sequence[str],
                text: ValueText = compact_text) -> str:
    """The user message of one read (NextTokenStrategy._content): the state first, so every read
    of a request shares a prefix."""
    return f"{content_text(state)}\n\n{question_text(question, labels, text)}"


def messages_for(state: Any, question: Mapping[str, Any], labels: Sequence[str],
                 instructions: Any = None, text: ValueText = compact_text) -> list[dict[str, Any]]:
    """The chat of one read: the request's instructions as a system message when given, then the
    prompt; the reply is the model's (the label its first token). ``text`` shows a non-string
    instructions or description (``compact_text``, or ``vllm_text`` on a vLLM)."""
    messages = [{"role": "user", "content": prompt_text(state, question, labels, text)}]
    system = "" if instructions is None else text(instructions)
    if system:
        messages.insert(0, {"role": "system", "content": system})
    return messages


def spellings(label: str) -> tuple[str, str]:
    """Where the model's tokenizer cannot be asked what a label's reply token is: the ways a label
    can come as the reply's first token, as written and with the leading space a BPE or
    SentencePiece tokenizer may fold into the token (`` A``, ``ĠA``, ``▁A``)."""
    return label, " " + label


def label_token_ids(qid: str, labels: Sequence[str],
                    token_ids: Mapping[str, Sequence[int]] | None) -> list[list[int]] | None:
    """Per label, the ids its reply's first token can be (``token_ids``: label -> ids, from the
    model's tokenizer); a label the tokenizer has no one token for is a 400."""
    if token_ids is None:
        return None
    found: list[list[int]] = []
    for label in labels:
        ids = [int(token) for token in token_ids.get(label, ())]
        if not ids:
            raise InvalidRequest(
                f"questions.{qid}: the label {label!r} is not a single token for this model, so it "
                "cannot be read as the reply's first token")
        found.append(ids)
    return found


def refuse_thinking(body: Mapping[str, Any]) -> None:
    """Thinking is always off in a read (``enable_thinking: false``): the label is the reply's
    first token, where a thinking model would start its reasoning. A request that turns it on is
    a 400 (vLLM's own ``_read_request`` refuses it too), not silently read without it."""
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


def label_probabilities(qid: str, labels: Sequence[str], read: LabelRead) -> list[float]:
    """The softmax over the labels' logprobs of one read (a label without one is a 400)."""
    missing = [label for label in labels if label not in read.logprobs]
    if missing:
        raise InvalidRequest(
            f"questions.{qid}: the label(s) {', '.join(missing)} cannot be read exactly: the backend "
            "did not return their logprobs")
    return softmax([read.logprobs[label] for label in labels])


def answer_from_read(qid: str, question: Mapping[str, Any], labels: Sequence[str],
                     read: LabelRead, mass_warning: float = 0.0,
                     baseline: Sequence[float] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """One System One answer and its diagnostics entry, from the labels' logprobs; a
    ``label_mass`` under ``mass_warning`` adds a ``low_label_mass`` warning (answer_warnings.py);
    a ``baseline`` (calibration.py) is divided out of the probabilities."""
    probs = label_probabilities(qid, labels, read)
    if baseline is not None:
        probs = calibration.calibrated(probs, baseline)
    best = 0
    for i, p in enumerate(probs):
        if p > probs[best]:
            best = i
    confidence = min(1.0, max(0.0, probs[best] * read.label_mass))
    diagnostics: dict[str, Any] = {"label_mass": read.label_mass}
    if baseline is not None:
        diagnostics["calibrated"] = True
    if read.argmax_is_label is not None:  # never a value that could not have been false
        diagnostics["argmax_is_label"] = read.argmax_is_label
    bounded = [label for label in labels if label in read.bounded]
    if bounded:  # ranked below the backend's last reported token: at most that token's logprob
        diagnostics["bounded_labels"] = bounded
    warning = answer_warnings.low_label_mass(read.label_mass, mass_warning)
    if warning is not None:
        diagnostics["warnings"] = [warning]
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
                 token_ids: Mapping[str, Sequence[int]] | None = None,
                 text: ValueText = compact_text, mass_warning: float = 0.0,
                 baselines: calibration.Baselines | None = None, salt: str | None = None,
                 partition: str | None = None) -> dict[str, Any]:
    """``answers``, ``usage`` and ``diagnostics`` for a System One request already validated
    (``app.decisions.schema.validate``). ``token_ids``: label -> the ids its reply's first token
    can be, when the model's tokenizer is known; ``text``: how a non-string instructions or
    description is shown; ``mass_warning``: the ``label_mass`` under which a question's
    diagnostics warn; ``baselines``: the model's content-free baselines when its answers are
    calibrated (calibration.py), kept per ``salt`` in the calling project's ``partition``. Every
    question is checked before any read is sent."""
    refuse_thinking(body)
    state = body["state"]
    instructions = body.get("instructions")
    kwargs = body.get("chat_template_kwargs")
    template_kwargs = kwargs if isinstance(kwargs, Mapping) else None
    questions: Mapping[str, Mapping[str, Any]] = body["questions"]
    plans = []
    for qid, question in questions.items():
        labels = labels_for(qid, question)
        plans.append((qid, question, labels, label_token_ids(qid, labels, token_ids)))

    async def baseline(qid: str, question: Mapping[str, Any], labels: Sequence[str],
                       ids: Sequence[Sequence[int]] | None) -> tuple[list[float], int] | None:
        if baselines is None:
            return None

        async def read_over(empty: Any) -> tuple[list[float], int]:
            read = await reader.read(messages_for(empty, question, labels, instructions, text), labels, ids,
                                     template_kwargs)
            return label_probabilities(qid, labels, read), read.input_tokens

        shown = None if instructions is None else text(instructions)
        return await baselines.baseline(calibration.key(shown, question, labels, template_kwargs, salt), read_over,
                                        partition)

    tasks = [asyncio.ensure_future(reader.read(messages_for(state, question, labels, instructions, text), labels,
                                               ids, template_kwargs))
             for _, question, labels, ids in plans]
    calibrations = [asyncio.ensure_future(baseline(qid, question, labels, ids)) for qid, question, labels, ids in plans]
    try:
        reads = await asyncio.gather(*tasks)
        found = await asyncio.gather(*calibrations)
    except BaseException:  # one read failed (or the request was cancelled): the others stop too
        for task in [*tasks, *calibrations]:
            task.cancel()
        raise
    answers: dict[str, Any] = {}
    diagnostics: dict[str, Any] = {}
    for (qid, question, labels, _), read, calibrating in zip(plans, reads, found):
        answers[qid], diagnostics[qid] = answer_from_read(qid, question, labels, read, mass_warning,
                                                          calibrating[0] if calibrating else None)
    calibration_tokens = sum(calibrating[1] for calibrating in found if calibrating)
    usage = {"input_tokens": sum(read.input_tokens for read in reads) + calibration_tokens,
             "output_tokens": len(reads) + sum(len(calibration.CONTENT_FREE_STATES)
                                               for calibrating in found if calibrating and calibrating[1]),
             "input_tokens_details": {"cached_tokens": sum(read.cached_tokens for read in reads)}}
    return {"answers": answers, "usage": usage, "diagnostics": diagnostics}
