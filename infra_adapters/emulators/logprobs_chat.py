"""First-token logprobs on vLLM's `/v1/chat/completions`, for label reading.

A chat request with `logprobs` or `top_logprobs` is answered here. The labels
are taken from the prompt's last line (``Answer with one label only: A, B.``,
as `app.decisions.labels` writes it): `yes`/`no` make a noul, digits a score,
letters a choice. Their probabilities are `answers.distribution(prompt, qtype,
None, labels)` -- the prompt is the last user message's text -- scaled by
`VllmState.label_mass`; the rest of the vocabulary's mass goes to `FILLERS`.
`VllmState.label_space_share` of each label's probability goes to its
leading-space variant (`" A"`), as BPE tokenizers split it after `Answer:`.

The first position reports `top_logprobs` entries (before any mask, as vLLM
does), and for `logprob_token_ids` a `logprob_token_ids` list of
`{"token_id", "token", "logprob"}` whatever their rank; `allowed_token_ids`
restricts the generated token. A tiny vocabulary gives every token an id:
`token_id(text)`.
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
from .openai_compat import Problem

__all__ = ["FILLERS", "LABEL_LINE", "VOCAB", "first_token_logprobs", "logprobs_body", "token_id",
           "tokenize", "wants_logprobs"]

LABEL_LINE = re.compile(r"^Answer with one label only: (.+)\.$")
MAX_TOP_LOGPROBS = 20
FLOOR = -9999.0
FILLERS = ("\n", " The", "The", " It", "**")  # share the probability that is not on a label
_LABELS = [*string.ascii_uppercase, *string.digits, "yes", "no"]
VOCAB: dict[str, int] = {}
for _i, _label in enumerate(_LABELS):
    VOCAB[_label] = 1000 + _i
    VOCAB[" " + _label] = 2000 + _i
for _i, _filler in enumerate(FILLERS):
    VOCAB[_filler] = 100 + _i
TOKENS = {tid: text for text, tid in VOCAB.items()}


def token_id(text: str) -> int:
    """The emulator's id of a token (labels, their leading-space variants and fillers)."""
    return VOCAB[text]


def tokenize(text: str) -> list[int]:
    """vLLM's `/tokenize` over the tiny vocabulary: a known token is one id, anything else one id
    per character (so a label such as `AB` is two tokens, as a real tokenizer may split it)."""
    if text in VOCAB:
        return [VOCAB[text]]
    return [VOCAB.get(ch, 5000 + ord(ch)) for ch in text]


def wants_logprobs(payload: dict[str, Any]) -> bool:
    return payload.get("logprobs") is True or payload.get("top_logprobs") is not None


def _labels(messages: list[Any]) -> tuple[str, list[str], str]:
    """(prompt text, labels, question type) from the last user message."""
    prompt = ""
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            prompt = message_text(message.get("content"))
            break
    last = prompt.rstrip("\n").rsplit("\n", 1)[-1]
    found = LABEL_LINE.match(last)
    labels = [label.strip() for label in found.group(1).split(",")] if found else []
    if labels == ["yes", "no"]:
        return prompt, labels, "noul"
    if labels and all(label in string.digits for label in labels):
        return prompt, labels, "score"
    return prompt, labels, "choice"


def first_token_logprobs(messages: list[Any], label_mass: float,
                         space_share: float = 0.0) -> dict[str, float]:
    """Every token's probability at the reply's first position (token text -> logprob)."""
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


def _int_list(payload: dict[str, Any], key: str) -> list[int] | None:
    value = payload.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool)
                                              for v in value):
        raise Problem(f"{key} must be a list of integers", param=key)
    return value


def _entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode())}


def logprobs_body(model: str, payload: dict[str, Any], messages: list[Any], *, label_mass: float,
                  space_share: float = 0.0, cached_tokens: int | None = None) -> dict[str, Any]:
    """The `chat.completion` answer with the first token's logprobs, as vLLM gives it
    (`cached_tokens`: the prompt's tokens read from the prefix cache, when it reports them)."""
    top_n = payload.get("top_logprobs") or 0
    if not isinstance(top_n, int) or isinstance(top_n, bool) or not 0 <= top_n <= MAX_TOP_LOGPROBS:
        raise Problem(f"top_logprobs must be an integer from 0 to {MAX_TOP_LOGPROBS}", param="top_logprobs")
    if payload.get("continue_final_message") and payload.get("add_generation_prompt", True):
        raise Problem("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    wanted = _int_list(payload, "logprob_token_ids")
    allowed = _int_list(payload, "allowed_token_ids")
    logprobs = first_token_logprobs(messages, label_mass, space_share)
    ranked = sorted(logprobs.items(), key=lambda item: -item[1])
    candidates = [(t, lp) for t, lp in ranked if allowed is None or VOCAB.get(t) in allowed]
    token, logprob = candidates[0] if candidates else ranked[0]
    first: dict[str, Any] = {**_entry(token, logprob),
                             "top_logprobs": [_entry(t, lp) for t, lp in ranked[:top_n]]}
    if wanted is not None:
        first["logprob_token_ids"] = [
            {"token_id": tid, "token": TOKENS.get(tid, f"<{tid}>"),
             "logprob": logprobs.get(TOKENS.get(tid, ""), FLOOR)} for tid in wanted]
    prompt = prompt_tokens(messages)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": token, "refusal": None, "tool_calls": [],
                        "reasoning_content": None},
            "logprobs": {"content": [first]},
            "finish_reason": "length",
            "stop_reason": None,
        }],
        "usage": {"prompt_tokens": prompt, "completion_tokens": 1, "total_tokens": prompt + 1,
                  "prompt_tokens_details": None if cached_tokens is None else {"cached_tokens": cached_tokens}},
        "system_fingerprint": None,
    }

