"""First-token logprobs of labels over an OpenAI-compatible `/v1/chat/completions`.

The reader behind label reading (``app.decisions.labels``): one call per
question, ``max_tokens: 1`` at temperature 0 with ``logprobs`` and
``top_logprobs: 20``, thinking off, and the assistant's reply prefilled so the
label is the very next token (``continue_final_message`` with
``add_generation_prompt: false``, as vLLM takes them).

``top_logprobs`` reports the distribution before any mask and is capped at 20,
so labels can fall out of it. Where the model's label token ids are known (per
label, the ids of its one-token spellings: ``A`` and its leading-space variant
`` A``) they are all sent as vLLM's ``logprob_token_ids`` (their logprobs come
back whatever their rank, in the first position's ``logprob_token_ids`` list)
and as ``allowed_token_ids`` (a guard: the one generated token is then a
label), and a label's logprob is the log-sum-exp of its spellings'. A backend
that takes no token ids is read by token text from ``top_logprobs``, where a
label's leading-space variants (`` A``, ``ĠA``, ``▁A``) count towards it. A
label read neither way is left out of ``logprobs``: the caller refuses the
question, since it cannot be read exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from infra_adapters.base import BackendProtocolError, CallOptions, ReplyNotOk
from infra_adapters.http import HttpBackendBase

__all__ = ["TOP_LOGPROBS", "FirstTokenRead", "OpenAILogprobsReader", "parse_first_token"]

TOP_LOGPROBS = 20  # the most OpenAI-compatible servers report
SPACE_MARKS = " Ġ▁"  # a leading space as tokenizers spell it (plain, GPT-2 BPE, SentencePiece)
CHAT_PATH = "/v1/chat/completions"
TOKENIZE_PATH = "/tokenize"
FLOOR = -9999.0  # vLLM's logprob for a token it cannot rank


@dataclass(frozen=True, slots=True)
class FirstTokenRead:
    """One read (``app.decisions.labels.LabelRead``)."""

    logprobs: dict[str, float]
    label_mass: float
    input_tokens: int
    argmax_is_label: bool
    cached_tokens: int  # of input_tokens, read from the backend's prefix cache (as it reports them)


def _logsumexp(values: Sequence[float]) -> float:
    top = max(values)
    return top + math.log(math.fsum(math.exp(v - top) for v in values))


class OpenAILogprobsReader(HttpBackendBase):
    """Reads label logprobs for one model of an OpenAI-compatible backend.

    ``vllm``: send vLLM's extras (``continue_final_message``, ``add_generation_prompt``,
    ``chat_template_kwargs``, ``logprob_token_ids``, ``allowed_token_ids``, ``cache_salt``).
    """

    kind = "openai-logprobs"

    def __init__(self, url: str, model: str, options: CallOptions, *, vllm: bool = True,
                 credential: str | None = None, **kwargs: Any) -> None:
        super().__init__(url, credential=credential, **kwargs)
        self.model = model
        self.options = options
        self.vllm = vllm

    def request_body(self, messages: list[dict[str, Any]], token_ids: Sequence[Sequence[int]] | None = None,
                     options: CallOptions | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": 1,
            "temperature": 0,
            "logprobs": True,
            "top_logprobs": TOP_LOGPROBS,
            "stream": False,
        }
        if self.vllm:
            body.update(continue_final_message=True, add_generation_prompt=False,
                        chat_template_kwargs={"enable_thinking": False})
            if token_ids:
                flat = [token for spelled in token_ids for token in spelled]
                body["logprob_token_ids"] = flat
                body["allowed_token_ids"] = list(flat)
            salt = (options or self.options).tenant_salt
            if salt:
                body["cache_salt"] = salt
        return body

    async def read(self, messages: list[dict[str, Any]], labels: Sequence[str],
                   token_ids: Sequence[Sequence[int]] | None = None) -> FirstTokenRead:
        return await self.read_with(self.options, messages, labels, token_ids)

    async def tokenize(self, text: str) -> list[int] | None:
        """vLLM's ``/tokenize`` (no special tokens); None where the server has no tokenizer route."""
        if not self.vllm:
            return None
        reply = await self._post(TOKENIZE_PATH, {"model": self.model, "prompt": text, "add_special_tokens": False},
                                 self.options)
        if reply.status in (404, 405):
            return None
        if reply.status != 200:
            raise ReplyNotOk(reply)
        unreadable = f"the backend's {TOKENIZE_PATH} answered without token ids"
        try:
            tokens = orjson.loads(reply.body)["tokens"]
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise BackendProtocolError(unreadable) from exc
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise BackendProtocolError(unreadable)
        return tokens

    async def read_with(self, options: CallOptions, messages: list[dict[str, Any]], labels: Sequence[str],
                        token_ids: Sequence[Sequence[int]] | None = None) -> FirstTokenRead:
        """One read with one call's options (timeout, trace headers, the project's cache salt).
        A 200 without the first token's logprobs is BackendProtocolError: the answer is unusable,
        though the backend is up."""
        body = self.request_body(messages, token_ids, options)
        reply = await self._post(CHAT_PATH, body, options)
        if reply.status != 200:  # a prompt over the context, a refused key, its own 5xx: passed on
            raise ReplyNotOk(reply)
        try:
            answer = orjson.loads(reply.body)
            first = answer["choices"][0]["logprobs"]["content"][0]
            usage = answer.get("usage") or {}
            # A prefix cache shared by tenants would tell one what another's prompt began with: its
            # count is passed on only from a cache the read's salt keeps to the caller (vLLM's).
            cached = _cached_tokens(usage) if "cache_salt" in body else 0
            return parse_first_token(first, labels, token_ids, int(usage.get("prompt_tokens") or 0), cached)
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise BackendProtocolError(
                f"the backend returned no logprobs for the reply's first token; label reading needs them "
                f"(its {CHAT_PATH} must answer `logprobs` with `top_logprobs`)") from exc


def _cached_tokens(usage: dict[str, Any]) -> int:
    """vLLM's ``usage.prompt_tokens_details.cached_tokens`` (null unless it reports them): 0 when absent."""
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return cached if isinstance(cached, int) and not isinstance(cached, bool) and cached >= 0 else 0


def parse_first_token(first: dict[str, Any], labels: Sequence[str], token_ids: Sequence[Sequence[int]] | None,
                      input_tokens: int, cached_tokens: int = 0) -> FirstTokenRead:
    """The labels' logprobs from the first position of an OpenAI ``logprobs.content``."""
    by_id: dict[int, float] = {}
    for entry in first.get("logprob_token_ids") or ():
        by_id[int(entry["token_id"])] = float(entry["logprob"])
    seen: dict[str, float] = {}  # token text -> logprob; the generated token and the top list
    for entry in [first, *(first.get("top_logprobs") or ())]:
        token = entry.get("token")
        if isinstance(token, str) and token not in seen:
            seen[token] = float(entry["logprob"])
    logprobs: dict[str, float] = {}
    for i, label in enumerate(labels):
        if token_ids is not None and by_id:  # every spelling's logprob, whatever its rank, or none
            spelled = token_ids[i]
            parts = [by_id[token] for token in spelled] if all(token in by_id for token in spelled) else []
        else:  # a backend without logprob_token_ids: by token text, as far as top_logprobs goes
            parts = [lp for token, lp in seen.items() if token.lstrip(SPACE_MARKS) == label]
        if parts:  # -inf (or NaN) as vLLM's floor, so the softmax stays defined
            logprobs[label] = _logsumexp([p if p >= FLOOR else FLOOR for p in parts])  # noqa: FURB136 (NaN)
    label_mass = math.fsum(math.exp(lp) for lp in logprobs.values())
    top_token = max(seen.items(), key=lambda item: item[1])[0] if seen else None
    argmax_is_label = top_token is not None and top_token.lstrip(SPACE_MARKS) in labels
    return FirstTokenRead(logprobs=logprobs, label_mass=min(1.0, label_mass), input_tokens=input_tokens,
                          argmax_is_label=argmax_is_label, cached_tokens=cached_tokens)
