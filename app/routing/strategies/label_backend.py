"""A generation model as a decision model: the backend of a model whose ``read_strategy`` is
``labels``. The forwarding path sends it a System One request like to any backend; this answers
it by label reading (``labels.decide``) over what the service offers: an OpenAI-compatible chat
with logprobs (vLLM, Ollama, llama.cpp's server) or the local runtime.

Label token ids come from the model's own tokenizer, found once per model and cached: the token
each label adds after the model's generation prompt where the reader can render one (vLLM's
``/tokenize`` of a chat, as vLLM's own ``reply_label_ids``; the local runtime), else each label's
one-token spellings (``A``, `` A``); a backend without a tokenizer endpoint is read by token text.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from app.routing.strategies import calibration, labels
from app.routing.strategies.base import StrategyBackend
from infra_adapters.base import Backend, CallOptions
from infra_adapters.vllm import salted


class ModelReader(Protocol):
    """Reads label logprobs of one model (``labels.LabelReader``) per call's options, and knows
    the model's tokenizer when the backend exposes it."""

    async def read_with(self, options: CallOptions, messages: list[dict[str, Any]], labels: Sequence[str],
                        token_ids: Sequence[Sequence[int]] | None = None,
                        template_kwargs: Mapping[str, Any] | None = None) -> labels.LabelRead: ...

    async def tokenize(self, text: str) -> list[int] | None:
        """The token ids of ``text`` without special tokens, or None when there is no tokenizer."""
        ...

    async def reply_label_ids(self, labels: Sequence[str]) -> dict[str, list[int]] | None:
        """Per label, the token it adds as the reply's first token after the model's generation
        prompt; None when the reader cannot render the model's chat prompt."""
        ...

    async def aclose(self) -> None: ...


class _Bound:
    """A ModelReader with one call's options: the ``labels.LabelReader`` of one request."""

    def __init__(self, reader: ModelReader, options: CallOptions) -> None:
        self._reader, self._options = reader, options

    async def read(self, messages: list[dict[str, Any]], labels: Sequence[str],
                   token_ids: Sequence[Sequence[int]] | None = None,
                   template_kwargs: Mapping[str, Any] | None = None) -> labels.LabelRead:
        return await self._reader.read_with(self._options, messages, labels, token_ids, template_kwargs)


async def spelled_label_ids(reader: ModelReader) -> dict[str, list[int]] | None:
    """Per label, the ids of its one-token spellings (``labels.spellings``: ``A``, then `` A`` when
    that is one other token); None without a tokenizer. A label that is not one token as written
    is left out (a question that needs it is a 400)."""
    spelled = [(label, spelling) for label in labels.ALL_LABELS for spelling in labels.spellings(label)]
    found = await asyncio.gather(*(reader.tokenize(spelling) for _, spelling in spelled))
    if any(ids is None for ids in found):
        return None
    by_label: dict[str, list[int]] = {}
    for (label, spelling), ids in zip(spelled, found):
        tokens = ids or []
        if spelling == label:
            if len(tokens) == 1:
                by_label[label] = [int(tokens[0])]
        elif label in by_label and len(tokens) == 1 and int(tokens[0]) not in by_label[label]:
            by_label[label].append(int(tokens[0]))  # two tokens (a space, then the label) is no spelling
    return by_label


class LabelBackend(StrategyBackend):
    """Wraps a service's backend for one model: decisions by label reading, anything else (chat,
    versions, model lists) by the service's backend as it is."""

    kind = "labels"
    reading, not_in_time = "label reading", "was not read"

    def __init__(self, inner: Backend, model: str, reader: ModelReader, mass_warning: float = 0.0,
                 calibrate: bool = False) -> None:
        super().__init__(inner, model)
        self._reader = reader
        self._mass_warning = mass_warning  # ARBITER_LABEL_MASS_WARNING
        # ARBITER_LABEL_CALIBRATION: content-free baselines divided out of the answers (calibration.py).
        self.baselines = calibration.Baselines() if calibrate else None
        self._token_ids: dict[str, list[int]] | None = None
        self._tokenizer_known = False
        self._tokenizer_lock = asyncio.Lock()
        # A vLLM's own /v1/systemone shows structured text its way: so do its reads (labels.py).
        self._value_text = labels.vllm_text if inner.kind == "vllm" else labels.compact_text

    async def token_ids(self) -> dict[str, list[int]] | None:
        """Per label, the ids its reply's first token can be, from the model's tokenizer, read once
        (None: no tokenizer)."""
        async with self._tokenizer_lock:  # concurrent first requests share one lookup
            if not self._tokenizer_known:
                found = await self._reader.reply_label_ids(labels.ALL_LABELS)
                self._token_ids = found if found is not None else await spelled_label_ids(self._reader)
                self._tokenizer_known = True
        return self._token_ids

    async def decide(self, body: dict[str, Any], options: CallOptions) -> dict[str, Any]:
        # Every read carries the project's prefix-cache salt combined with the caller's own (SPEC §1).
        salt = salted({"cache_salt": body.get("cache_salt")}, options.tenant_salt).get("cache_salt")
        # The project's own key stays what its queue place and its kept baselines go by: a caller's
        # cache_salt is free to vary, and would otherwise buy it a partition per value.
        reads = dataclasses.replace(options, tenant_salt=salt if isinstance(salt, str) else None,
                                    partition=options.project_key)
        token_ids = await self.token_ids()
        return await labels.decide(body, _Bound(self._reader, reads), token_ids, self._value_text,
                                   self._mass_warning, self.baselines, reads.tenant_salt, reads.partition)

    async def aclose(self) -> None:
        await self._reader.aclose()
