"""First-token logprobs of labels over an OpenAI-compatible `/v1/chat/completions`.

The reader behind label reading (``app.routing.strategies.labels``): one call per question,
``max_tokens: 1`` at temperature 0 with ``logprobs`` and ``top_logprobs: 20``, the chat ending at
the generation prompt, thinking off in each backend's own words (vLLM:
``chat_template_kwargs.enable_thinking: false``; Ollama: ``reasoning_effort: "none"``, which its
``openai/openai.go`` turns into ``think: false``).

vLLM (``dialect="vllm"``), read as vLLM 0.33 answers (``vllm/v1/sample/sampler.py``,
``vllm/entrypoints/openai/chat_completion/serving.py``):
- The label ids (``LabelIds``: per label, the token it adds after the model's generation prompt,
  found once per model through ``/tokenize`` and ``/detokenize`` as vLLM's own
  ``reply_label_ids`` finds them) are sent as ``logprob_token_ids``: the first position's logprobs
  are then the sampled token and exactly those ids, listed in ``top_logprobs`` as ``{token,
  logprob, bytes}`` (the sampled token first); there is no id field, so each read asks
  ``return_tokens_as_token_ids: true`` and every token comes back as ``"token_id:N"`` (as on a
  server started with ``--return-tokens-as-token-ids``).
- No ``allowed_token_ids``: with the mask the sampled token is always a label. Without it, at
  temperature 0 the sampled token is the model's argmax, so ``argmax_is_label`` is true only when
  the argmax is a label.

Any other backend is read by token text from ``top_logprobs``: every entry whose text is a label,
with or without a leading space (`` A``, ``ĠA``, ``▁A``), counts towards it (two tokens that decode
to the same text both count). A label missing from a full top list ranks below its last entry:
its logprob is bounded by that entry's, and the read says so (``bounded``).
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from infra_adapters.base import BackendProtocolError, CallOptions, ReplyNotOk
from infra_adapters.http import HttpBackendBase

__all__ = ["TOP_LOGPROBS", "FirstTokenRead", "OpenAILogprobsReader", "parse_first_token"]

TOP_LOGPROBS = 20  # the most OpenAI-compatible servers report (Ollama's cap too)
SPACE_MARKS = " Ġ▁"  # a leading space as tokenizers spell it (plain, GPT-2 BPE, SentencePiece)
CHAT_PATH = "/v1/chat/completions"
TOKENIZE_PATH = "/tokenize"
DETOKENIZE_PATH = "/detokenize"
FLOOR = -9999.0  # vLLM's logprob for a token it cannot rank
_TOKEN_ID = re.compile(r"token_id:(\d+)")  # vLLM's format_token_id_placeholder
DIALECTS = ("vllm", "ollama", "openai")


@dataclass(frozen=True, slots=True)
class FirstTokenRead:
    """One read (``app.routing.strategies.labels.LabelRead``)."""

    logprobs: dict[str, float]
    label_mass: float
    input_tokens: int
    argmax_is_label: bool | None
    cached_tokens: int  # of input_tokens, read from the backend's prefix cache (as it reports them)
    bounded: tuple[str, ...] = field(default=())


def _logsumexp(values: Sequence[float]) -> float:
    top = max(values)
    return top + math.log(math.fsum(math.exp(v - top) for v in values))


class OpenAILogprobsReader(HttpBackendBase):
    """Reads label logprobs for one model of an OpenAI-compatible backend (``dialect``: "vllm",
    "ollama" or "openai")."""

    kind = "openai-logprobs"

    def __init__(self, url: str, model: str, options: CallOptions, *, dialect: str = "vllm",
                 credential: str | None = None, salted: bool | None = None, **kwargs: Any) -> None:
        super().__init__(url, credential=credential, **kwargs)
        if dialect not in DIALECTS:
            raise ValueError(f"unknown dialect {dialect!r}; use one of {DIALECTS}")
        self.model = model
        self.options = options
        self.dialect = dialect
        # Whether reads carry the call's cache_salt: vLLM's, also one read in the plain dialect.
        self.salted = dialect == "vllm" if salted is None else salted

    @property
    def vllm(self) -> bool:
        return self.dialect == "vllm"

    def request_body(self, messages: list[dict[str, Any]], token_ids: Sequence[Sequence[int]] | None = None,
                     options: CallOptions | None = None,
                     template_kwargs: Mapping[str, Any] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": 1,
            "temperature": 0,
            "logprobs": True,
            "top_logprobs": TOP_LOGPROBS,
            "stream": False,
        }
        if self.dialect == "ollama":
            body["reasoning_effort"] = "none"
        elif self.vllm:
            kwargs = {**(template_kwargs or {}), "enable_thinking": False}
            body.update(add_generation_prompt=True, continue_final_message=False, chat_template_kwargs=kwargs)
            if token_ids:
                body["logprob_token_ids"] = [token for ids in token_ids for token in ids]
                body["return_tokens_as_token_ids"] = True
        salt = (options or self.options).tenant_salt if self.salted else None
        if salt:
            body["cache_salt"] = salt
        return body

    async def read(self, messages: list[dict[str, Any]], labels: Sequence[str],
                   token_ids: Sequence[Sequence[int]] | None = None,
                   template_kwargs: Mapping[str, Any] | None = None) -> FirstTokenRead:
        return await self.read_with(self.options, messages, labels, token_ids, template_kwargs)

    async def _json(self, path: str, payload: dict[str, Any]) -> Any:
        """A tokenizer call's answer; None where the server has no such route or refuses the form."""
        reply = await self._post(path, payload, self.options)
        if reply.status in (400, 404, 405, 422, 501):
            return None
        if reply.status != 200:
            raise ReplyNotOk(reply)
        try:
            return orjson.loads(reply.body)
        except orjson.JSONDecodeError as exc:
            raise BackendProtocolError(f"the backend's {path} answered with no JSON") from exc

    async def tokenize(self, text: str) -> list[int] | None:
        """vLLM's ``/tokenize`` (no special tokens); None where the server has no tokenizer route."""
        if not self.vllm:
            return None
        data = await self._json(TOKENIZE_PATH, {"model": self.model, "prompt": text, "add_special_tokens": False})
        return None if data is None else _tokens(data)

    async def reply_label_ids(self, labels: Sequence[str]) -> dict[str, list[int]] | None:
        """Per label, the token it adds as the reply's first token after this model's generation
        prompt (thinking off), found as vLLM's ``reply_label_ids`` finds it
        (``vllm/entrypoints/openai/decisions/strategies.py``): the ids of a probe chat up to the
        generation prompt, their text, and that text with the label appended, which must be the same
        ids and one more. None where the server cannot render a chat prompt (not vLLM); a label that
        is not one distinct token there is left out."""
        if not self.vllm:
            return None
        probe = await self._json(TOKENIZE_PATH, {
            "model": self.model, "messages": [{"role": "user", "content": "x"}], "add_generation_prompt": True,
            "continue_final_message": False, "add_special_tokens": False,
            "chat_template_kwargs": {"enable_thinking": False}})
        if probe is None:
            return None
        prompt = _tokens(probe)
        text = await self._json(DETOKENIZE_PATH, {"model": self.model, "tokens": prompt})
        if not isinstance(text, dict) or not isinstance(text.get("prompt"), str):
            return None
        answers = await asyncio.gather(*(
            self._json(TOKENIZE_PATH, {"model": self.model, "prompt": text["prompt"] + label,
                                       "add_special_tokens": False}) for label in labels))
        found: dict[str, list[int]] = {}
        for label, data in zip(labels, answers):
            ids = None if data is None else _tokens(data)
            one_more = ids is not None and len(ids) == len(prompt) + 1 and ids[:-1] == prompt
            if ids and one_more and all(ids[-1] not in taken for taken in found.values()):
                found[label] = [ids[-1]]
        return found

    async def read_with(self, options: CallOptions, messages: list[dict[str, Any]], labels: Sequence[str],
                        token_ids: Sequence[Sequence[int]] | None = None,
                        template_kwargs: Mapping[str, Any] | None = None) -> FirstTokenRead:
        """One read with one call's options (timeout, trace headers, the project's cache salt).
        A 200 without the first token's logprobs is BackendProtocolError: the answer is unusable,
        though the backend is up."""
        body = self.request_body(messages, token_ids, options, template_kwargs)
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
            ids = token_ids if "logprob_token_ids" in body else None
            return parse_first_token(first, labels, ids, int(usage.get("prompt_tokens") or 0), cached)
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise BackendProtocolError(
                f"the backend returned no logprobs for the reply's first token; label reading needs them "
                f"(its {CHAT_PATH} must answer `logprobs` with `top_logprobs`)") from exc


def _tokens(data: Any) -> list[int]:
    tokens = data.get("tokens") if isinstance(data, dict) else None
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise BackendProtocolError(f"the backend's {TOKENIZE_PATH} answered without token ids")
    return tokens


def _cached_tokens(usage: dict[str, Any]) -> int:
    """vLLM's ``usage.prompt_tokens_details.cached_tokens`` (null unless it reports them): 0 when absent."""
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return cached if isinstance(cached, int) and not isinstance(cached, bool) and cached >= 0 else 0


def _entries(first: dict[str, Any]) -> list[tuple[str, float]]:
    """(token, logprob) of the first position: its ``top_logprobs`` (distinct tokens), and the
    sampled token where the list does not hold it."""
    entries = [(entry["token"], float(entry["logprob"])) for entry in first.get("top_logprobs") or ()
               if isinstance(entry.get("token"), str)]
    sampled = first.get("token")
    logprob = first.get("logprob")
    if isinstance(sampled, str) and logprob is not None and (sampled, float(logprob)) not in entries:
        entries.insert(0, (sampled, float(logprob)))
    return entries


def _id_of(token: str) -> int | None:
    found = _TOKEN_ID.fullmatch(token)
    return int(found.group(1)) if found else None


def parse_first_token(first: dict[str, Any], labels: Sequence[str], token_ids: Sequence[Sequence[int]] | None,
                      input_tokens: int, cached_tokens: int = 0) -> FirstTokenRead:
    """The labels' logprobs from the first position of an OpenAI ``logprobs.content``.

    ``token_ids`` (per label, its ids) when the read asked them by id: tokens are then
    ``"token_id:N"``, and a label's logprob is the log-sum-exp of its ids'. Else (or where the
    tokens came back as text all the same) by token text."""
    entries = _entries(first)
    logprobs: dict[str, float] = {}
    bounded: list[str] = []
    sampled = first.get("token")
    by_id = {token: lp for text, lp in entries if (token := _id_of(text)) is not None}
    if token_ids is not None and by_id:  # a server that spells tokens as text is read by text
        for label, ids in zip(labels, token_ids):
            if ids and all(token in by_id for token in ids):
                logprobs[label] = _logsumexp([max(by_id[token], FLOOR) for token in ids])
        top_id = _id_of(sampled) if isinstance(sampled, str) else None
        argmax_is_label: bool | None = (None if top_id is None
                                        else any(top_id in ids for ids in token_ids))
    else:
        for label in labels:
            parts = [lp for text, lp in entries if text.lstrip(SPACE_MARKS) == label]
            if parts:
                logprobs[label] = _logsumexp([max(p, FLOOR) for p in parts])
        floor = min((lp for _, lp in entries), default=None)
        full = len(first.get("top_logprobs") or ()) >= TOP_LOGPROBS  # the list, not the sampled token
        if floor is not None and full:
            for label in labels:  # ranked below every reported token: at most the last one's logprob
                if label not in logprobs:
                    logprobs[label] = max(floor, FLOOR)
                    bounded.append(label)
        top = max(entries, key=lambda entry: entry[1])[0] if entries else None
        argmax_is_label = None if top is None else top.lstrip(SPACE_MARKS) in labels
    exact = [lp for label, lp in logprobs.items() if label not in bounded]
    label_mass = math.fsum(math.exp(lp) for lp in exact)
    return FirstTokenRead(logprobs=logprobs, label_mass=min(1.0, label_mass), input_tokens=input_tokens,
                          argmax_is_label=argmax_is_label, cached_tokens=cached_tokens, bounded=tuple(bounded))
