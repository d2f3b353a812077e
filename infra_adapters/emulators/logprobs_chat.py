"""The reply's first token and its logprobs on vLLM's `/v1/chat/completions`, for label reading.

A chat request with `logprobs: true` (and no stream) is answered here with one generated token.
The labels are taken from the end of the prompt: vLLM's own label question (question_types.py:
option lines ``A: ...`` / ``0: ...`` then ``Answer with the letter of one option only.``, ``Answer
with the number of one level only.`` or ``Answer with yes or no only.``), or a last line
``Answer with one label only: A, B.``: `yes`/`no` make a noul, digits a score, letters a choice.
Their probabilities are `answers.distribution(prompt, qtype, None, labels)` -- the prompt is the
last user message's text -- scaled by `VllmState.label_mass`; the rest of the vocabulary's mass
goes to `FILLERS`. `VllmState.label_space_share` of each label's probability goes to its
leading-space variant (`" A"`), as BPE tokenizers split it after `Answer:`. Every other token
of the vocabulary has logprob `FLOOR`.

The position is reported as vLLM 0.33 reports it (vllm/entrypoints/openai/chat_completion/
serving.py `_create_chat_logprobs` and `_get_top_logprobs`): `{token, logprob, bytes,
top_logprobs: [{token, logprob, bytes}, ...]}`. The candidates are gathered as the sampler
gathers them (vllm/v1/sample/sampler.py): the sampled token first, then the `top_logprobs`
best tokens -- or, when the request has `logprob_token_ids`, exactly those ids, which the
sampler prefers over top-k and which `_get_top_logprobs(return_all=True)` lists in full.
`allowed_token_ids` masks what is sampled; under `--logprobs-mode raw_logprobs` (the default) the
reported logprobs are the model's before the mask, under `processed_logprobs` after the mask
(and the temperature, for a sampled rather than greedy read). With `--return-tokens-as-token-ids`
or the request's `return_tokens_as_token_ids`, tokens are spelled "token_id:N"
(vllm/entrypoints/generate/base/serving.py `format_token_id_placeholder`).

A tiny vocabulary gives every token an id (`token_id(text)`, `decode(id)`); `/tokenize` spells
anything else one id per character.
"""

from __future__ import annotations

import math
import re
import string
import time
import uuid
from typing import Any

from .answers import distribution
from .generation import message_text, prompt_tokens
from .vllm_validation import ParamError

__all__ = ["FILLERS", "FLOOR", "LABEL_LINE", "VOCAB", "VOCAB_SIZE", "decode", "first_token_logprobs",
           "logprobs_body", "position_logprobs", "token_id", "tokenize"]

LABEL_LINE = re.compile(r"^Answer with one label only: (.+)\.$")
MAX_LOGPROBS = 20  # vLLM's default --max-logprobs
MAX_LOGPROB_TOKEN_IDS = 128  # vllm/sampling_params.py MAX_LOGPROB_TOKEN_IDS
SAMPLING_EPS = 1e-5  # sampler.py: below this temperature a read is greedy
FLOOR = -9999.0  # chat_completion/serving.py: a logprob is reported as at least this
FILLERS = ("\n", " The", "The", " It", "**")  # share the probability that is not on a label
_LABELS = [*string.ascii_uppercase, *string.digits, "yes", "no"]
VOCAB: dict[str, int] = {}
for _i, _label in enumerate(_LABELS):
    VOCAB[_label] = 1000 + _i
    VOCAB[" " + _label] = 2000 + _i
for _i, _filler in enumerate(FILLERS):
    VOCAB[_filler] = 100 + _i
TOKENS = {tid: text for text, tid in VOCAB.items()}
CHAR_BASE = 5000  # `tokenize` spells any other character as CHAR_BASE + its code point
VOCAB_SIZE = CHAR_BASE + 0x110000


def token_id(text: str) -> int:
    """The emulator's id of a token (labels, their leading-space variants and fillers)."""
    return VOCAB[text]


def decode(tid: int) -> str:
    """The text of one token id."""
    if tid in TOKENS:
        return TOKENS[tid]
    if CHAR_BASE <= tid < VOCAB_SIZE and not 0xD800 <= tid - CHAR_BASE < 0xE000:
        return chr(tid - CHAR_BASE)
    return f"<{tid}>"


def tokenize(text: str) -> list[int]:
    """vLLM's `/tokenize` over the tiny vocabulary: a known token is one id, anything else one id
    per character (so a label such as `AB` is two tokens, as a real tokenizer may split it)."""
    if text in VOCAB:
        return [VOCAB[text]]
    return [VOCAB.get(ch, CHAR_BASE + ord(ch)) for ch in text]


# vllm/entrypoints/openai/decisions/question_types.py: each type's reply instruction, ending the
# prompt NextTokenStrategy writes (and Arbiter's label reader, which writes it as vLLM does).
REPLY_INSTRUCTIONS = {
    "Answer with the letter of one option only.": ("choice", string.ascii_uppercase),
    "Answer with yes or no only.": ("noul", "yes/no"),
    "Answer with the number of one level only.": ("score", string.digits),
}


def _labelled(lines: list[str], alphabet: str) -> list[str]:
    """The labels of the option lines (``A: ...``, ``0: ...``) just above the reply instruction."""
    found: list[str] = []
    for line in reversed(lines):
        label = line[:1]
        if line[1:3] != ": " or label not in alphabet:
            break
        found.append(label)
    found.reverse()
    return found if found == list(alphabet[:len(found)]) else []


def _labels(messages: list[Any]) -> tuple[str, list[str], str]:
    """(prompt text, labels, question type) from the last user message."""
    prompt = ""
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            prompt = message_text(message.get("content"))
            break
    lines = prompt.rstrip("\n").split("\n")
    last = lines[-1]
    labels: list[str] = []
    if last in REPLY_INSTRUCTIONS:
        qtype, alphabet = REPLY_INSTRUCTIONS[last]
        labels = ["yes", "no"] if qtype == "noul" else _labelled(lines[:-1], alphabet)
    elif found := LABEL_LINE.match(last):
        labels = [label.strip() for label in found.group(1).split(",")]
    if labels == ["yes", "no"]:
        return prompt, labels, "noul"
    if labels and all(label in string.digits for label in labels):
        return prompt, labels, "score"
    return prompt, labels, "choice"


def first_token_logprobs(messages: list[Any], label_mass: float,
                         space_share: float = 0.0) -> dict[str, float]:
    """The tokens with probability at the reply's first position (token text -> logprob)."""
    prompt, labels, qtype = _labels(messages)
    probs: dict[str, float] = {}
    if labels:
        d = distribution(prompt, qtype, None, labels)
        for label, p in zip(labels, d.probs):
            share = p * label_mass
            probs[label] = share * (1.0 - space_share)
            if space_share > 0.0:
                probs[" " + label] = share * space_share
        rest = 1.0 - label_mass
    else:
        rest = 1.0
    for filler in FILLERS:
        probs[filler] = rest / len(FILLERS)
    return {token: math.log(p) if p > 0.0 else FLOOR for token, p in probs.items()}


def position_logprobs(messages: list[Any], label_mass: float, space_share: float = 0.0) -> dict[int, float]:
    """The model's logprob of every named token at the first position (id -> logprob, `FLOOR` for
    the tokens without probability). Any other id also has logprob `FLOOR`."""
    known = first_token_logprobs(messages, label_mass, space_share)
    return {tid: known.get(text, FLOOR) for text, tid in VOCAB.items()}


def _logsumexp(values: list[float]) -> float:
    top = max(values)
    return top + math.log(math.fsum(math.exp(v - top) for v in values))


def _int_list(payload: dict[str, Any], key: str) -> list[int] | None:
    """A validated list of ids (pydantic's lax int: "3" and 3.0 are 3)."""
    value = payload.get(key)
    if value is None:
        return None
    return [int(float(v)) if isinstance(v, str | float) else int(v) for v in value]


def check_sampling(payload: dict[str, Any], logprobs: bool, top_logprobs: int) -> None:
    """The engine's checks of the sampling params (vllm/sampling_params.py `_validate_logprobs`,
    `_validate_allowed_token_ids`) for what `to_sampling_params` makes of the request
    (chat_completion/protocol.py: `logprobs=top_logprobs` only without `logprob_token_ids`)."""
    wanted = _int_list(payload, "logprob_token_ids") or None
    allowed = _int_list(payload, "allowed_token_ids")
    if logprobs and not wanted and top_logprobs:
        n = VOCAB_SIZE if top_logprobs == -1 else top_logprobs
        if n > MAX_LOGPROBS:
            raise ParamError(f"Requested sample logprobs of {n}, which is greater than max allowed: {MAX_LOGPROBS}",
                             parameter="logprobs", value=n)
    if wanted is not None:
        if len(wanted) > MAX_LOGPROB_TOKEN_IDS:
            raise ParamError(f"Requested logprob_token_ids of length {len(wanted)}, which is greater than max "
                             f"allowed: {MAX_LOGPROB_TOKEN_IDS}", parameter="logprob_token_ids", value=len(wanted))
        invalid = [t for t in wanted if t < 0 or t >= VOCAB_SIZE]
        if invalid:
            raise ParamError(f"token_id(s) {invalid} in logprob_token_ids contain out-of-vocab token ids. "
                             f"Vocabulary size: {VOCAB_SIZE}", parameter="logprob_token_ids", value=invalid)
    if allowed is not None:
        if not allowed:
            raise ParamError("allowed_token_ids is not None and empty!", parameter="allowed_token_ids", value=allowed)
        invalid = [t for t in allowed if t < 0 or t >= VOCAB_SIZE]
        if invalid:
            raise ParamError("allowed_token_ids contains out-of-vocab token id!", parameter="allowed_token_ids",
                             value=invalid)


def _reported(raw: dict[int, float], allowed: list[int] | None, temperature: float, mode: str) -> dict[int, float]:
    """What the sampler reports for each id (sampler.py `Sampler.forward`): the raw values, or
    after the `allowed_token_ids` mask (and the temperature when sampling) for the processed modes.
    The emulator's logits are its logprobs, so the logits modes report the same numbers."""
    if mode in ("raw_logprobs", "raw_logits"):
        return raw
    scale = temperature if temperature >= SAMPLING_EPS else 1.0
    keep = set(raw) if allowed is None else set(allowed)
    logits = {tid: (lp / scale if tid in keep else -math.inf) for tid, lp in raw.items()}
    if mode == "processed_logits":
        return logits
    total = _logsumexp([v for v in logits.values() if v > -math.inf])
    return {tid: v - total for tid, v in logits.items()}


def _entry(tid: int, value: float, as_id: bool) -> dict[str, Any]:
    """One of `_get_top_logprobs`'s entries: its bytes are those of the token as spelled."""
    token = f"token_id:{tid}" if as_id else decode(tid)
    return {"token": token, "logprob": max(value, FLOOR), "bytes": list(token.encode("utf-8", errors="replace"))}


def logprobs_body(model: str, payload: dict[str, Any], messages: list[Any], *, label_mass: float,
                  space_share: float = 0.0, cached_tokens: int | None = None,
                  return_tokens_as_token_ids: bool = False, logprobs_mode: str = "raw_logprobs",
                  top_logprobs: int = 0, temperature: float | None = None) -> dict[str, Any]:
    """The `chat.completion` answer with the first token's logprobs, as vLLM gives it
    (`cached_tokens`: the prompt's tokens read from the prefix cache, when it reports them).
    `payload` has passed the request checks (`vllm_openai`)."""
    wanted = _int_list(payload, "logprob_token_ids") or None
    allowed = _int_list(payload, "allowed_token_ids")
    raw = position_logprobs(messages, label_mass, space_share)
    for tid in [*(wanted or ()), *(allowed or ())]:
        raw.setdefault(tid, FLOOR)
    temp = 1.0 if temperature is None else temperature  # ChatCompletionRequest._DEFAULT_SAMPLING_PARAMS
    reported = _reported(raw, allowed, temp, logprobs_mode)
    # The token generated: the best one the mask allows (lowest id on ties, as argmax).
    candidates = raw if allowed is None else {tid: raw[tid] for tid in allowed}
    sampled = min(candidates, key=lambda tid: (-candidates[tid], tid))
    if wanted is not None:  # sampler.py gather_specific_token_logprobs: sampled first, then the ids
        ids = list(dict.fromkeys([sampled, *wanted]))
        shown = ids
    else:  # sampler.py gather_logprobs: sampled first, then the top-k (LogprobsProcessor dedups)
        ranked = sorted(raw, key=lambda tid: (-reported[tid], tid))
        ids = list(dict.fromkeys([sampled, *ranked[:max(top_logprobs, 0)]]))
        shown = ids if top_logprobs == -1 else ids[:top_logprobs]
    as_id = return_tokens_as_token_ids
    text = decode(sampled)
    first = {
        "token": f"token_id:{sampled}" if as_id else text,
        "logprob": max(reported[sampled], FLOOR),
        "bytes": list(text.encode("utf-8", errors="replace")),  # the decoded token's, even as "token_id:N"
        "top_logprobs": [_entry(tid, reported[tid], as_id) for tid in shown],
    }
    prompt = prompt_tokens(messages)
    details = None if cached_tokens is None else {  # serving.py _make_prompt_tokens_details
        "cached_tokens": cached_tokens, "created_cache_tokens": prompt - cached_tokens, "multimodal_tokens": None}
    return chat_completion(model, text, {"content": [first]}, "length",
                           {"prompt_tokens": prompt, "total_tokens": prompt + 1, "completion_tokens": 1,
                            "prompt_tokens_details": details, "completion_tokens_details": None})


def chat_completion(model: str, content: str, logprobs: dict[str, Any] | None, finish_reason: str,
                    usage: dict[str, Any]) -> dict[str, Any]:
    """chat_completion/protocol.py ChatCompletionResponse as vLLM dumps it (`model_dump()`: every
    field, `tool_calls` left out of the message when empty, the reasoning under `reasoning`)."""
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": content, "refusal": None, "annotations": None,
                        "audio": None, "function_call": None, "reasoning": None},
            "logprobs": logprobs,
            "finish_reason": finish_reason,
            "stop_reason": None,
            "token_ids": None,
            "routed_experts": None,
            "weight_versions": None,
        }],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": usage,
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "prompt_text": None,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }
