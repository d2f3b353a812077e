"""The vLLM emulator's chat with logprobs: the first token's label logprobs (label reading)."""

from __future__ import annotations

import math
from typing import Any

import httpx
import pytest

from infra_adapters.emulators.answers import count_tokens, distribution
from infra_adapters.emulators.logprobs_chat import FILLERS, token_id
from infra_adapters.emulators.vllm import VllmState

MODEL = "Qwen/Qwen3-0.6B"
PROMPT = "My card was charged twice.\n\nWhich team?\nOptions:\nA: billing\nB: shipping\nC: security\n" \
         "Answer with one label only: A, B, C."


def _read(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 1, "logprobs": True, "top_logprobs": 20,
            "messages": [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": "Answer:"}],
            "continue_final_message": True, "add_generation_prompt": False, **extra}


def _first(resp: httpx.Response) -> dict[str, Any]:
    assert resp.status_code == 200, resp.text
    (choice,) = resp.json()["choices"]
    first: dict[str, Any] = choice["logprobs"]["content"][0]
    return first


def test_label_logprobs_follow_the_prompt_distribution(vllm_client: httpx.Client, vllm: VllmState) -> None:
    vllm.label_mass = 0.8
    first = _first(vllm_client.post("/v1/chat/completions", json=_read()))
    top = {e["token"]: e["logprob"] for e in first["top_logprobs"]}
    probs = distribution(PROMPT, "choice", None, ["A", "B", "C"]).probs
    for label, p in zip("ABC", probs):
        assert math.exp(top[label]) == pytest.approx(0.8 * p)
    for filler in FILLERS:
        assert math.exp(top[filler]) == pytest.approx(0.2 / len(FILLERS))
    ranked = [e["logprob"] for e in first["top_logprobs"]]
    assert ranked == sorted(ranked, reverse=True)
    assert first["token"] == first["top_logprobs"][0]["token"]


def test_top_logprobs_is_capped_and_token_ids_are_answered(vllm_client: httpx.Client, vllm: VllmState) -> None:
    vllm.label_space_share = 0.5
    first = _first(vllm_client.post("/v1/chat/completions", json=_read(top_logprobs=2)))
    assert len(first["top_logprobs"]) == 2
    ids = [token_id("A"), token_id("B"), token_id("C")]
    first = _first(vllm_client.post("/v1/chat/completions",
                                    json=_read(top_logprobs=1, logprob_token_ids=ids, allowed_token_ids=ids)))
    by_id = {e["token_id"]: e for e in first["logprob_token_ids"]}
    assert [by_id[i]["token"] for i in ids] == ["A", "B", "C"]
    probs = distribution(PROMPT, "choice", None, ["A", "B", "C"]).probs
    assert [math.exp(by_id[i]["logprob"]) for i in ids] == pytest.approx([0.9 * 0.5 * p for p in probs])
    assert first["token"] in ("A", "B", "C")  # allowed_token_ids masks the generated token


def test_refusals_and_plain_chat(vllm_client: httpx.Client) -> None:
    both = vllm_client.post("/v1/chat/completions", json=_read(add_generation_prompt=True))
    assert both.status_code == 400 and "continue_final_message" in both.json()["error"]["message"]
    too_many = vllm_client.post("/v1/chat/completions", json=_read(top_logprobs=21))
    assert too_many.status_code == 400
    plain = vllm_client.post("/v1/chat/completions", json={"model": MODEL, "messages": [
        {"role": "user", "content": "hello"}]}).json()
    assert plain["choices"][0]["logprobs"] is None


def test_prefix_cache_hits_are_reported_per_cache_salt(vllm_client: httpx.Client, vllm: VllmState) -> None:
    def usage(**extra: Any) -> Any:
        resp = vllm_client.post("/v1/chat/completions", json=_read(**extra))
        assert resp.status_code == 200, resp.text
        return resp.json()["usage"]

    assert usage()["prompt_tokens_details"] is None  # no prefix caching: no details, as vLLM
    vllm.prefix_caching = True
    whole = count_tokens(PROMPT + "Answer:")
    assert usage(cache_salt="a")["prompt_tokens_details"] == {"cached_tokens": 0}
    assert usage(cache_salt="a")["prompt_tokens_details"] == {"cached_tokens": whole}
    assert usage(cache_salt="b")["prompt_tokens_details"] == {"cached_tokens": 0}  # a salt keeps its own cache
    other = _read(cache_salt="a")
    other["messages"][0]["content"] = PROMPT.replace("Which team?", "Which queue?")
    resp = vllm_client.post("/v1/chat/completions", json=other)
    shared = count_tokens("My card was charged twice.\n\nWhich ")  # the common prefix
    assert resp.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": shared}
