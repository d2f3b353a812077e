"""Reading the labels out of one chat completion's first position, in each form real servers send:
vLLM 0.33 (ids asked as logprob_token_ids come back in top_logprobs, spelled "token_id:N"), and
servers read by token text (Ollama, llama.cpp: at most 20 entries)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from infra_adapters.base import CallOptions
from infra_adapters.openai_logprobs import TOP_LOGPROBS, OpenAILogprobsReader, parse_first_token


def entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode())}


def vllm_first(sampled: int, asked: dict[int, float], sampled_logprob: float) -> dict[str, Any]:
    """What vLLM's _create_chat_logprobs writes for logprob_token_ids with token ids as text: the
    sampled token, then every asked id, in top_logprobs (no id field, no logprob_token_ids key)."""
    top = [entry(f"token_id:{sampled}", sampled_logprob)]
    top += [entry(f"token_id:{tid}", lp) for tid, lp in asked.items() if tid != sampled]
    return {**entry(f"token_id:{sampled}", sampled_logprob), "top_logprobs": top}


def test_vllm_ids_come_back_in_top_logprobs_as_token_id_text() -> None:
    first = vllm_first(999, {10: math.log(0.2), 11: math.log(0.1)}, math.log(0.6))
    read = parse_first_token(first, ["A", "B"], [[10], [11]], input_tokens=7)
    assert read.logprobs == pytest.approx({"A": math.log(0.2), "B": math.log(0.1)})
    assert read.label_mass == pytest.approx(0.3)
    assert read.argmax_is_label is False  # the model's argmax (999) is no label
    assert read.bounded == ()


def test_the_argmax_is_a_label_when_the_sampled_token_is_one() -> None:
    first = vllm_first(11, {10: math.log(0.2), 11: math.log(0.7)}, math.log(0.7))
    read = parse_first_token(first, ["A", "B"], [[10], [11]], input_tokens=7)
    assert read.argmax_is_label is True
    assert read.logprobs["B"] == pytest.approx(math.log(0.7))


def test_a_label_of_two_spellings_sums_both_ids() -> None:
    first = vllm_first(5, {10: math.log(0.2), 20: math.log(0.1), 11: math.log(0.3)}, math.log(0.3))
    read = parse_first_token(first, ["A", "B"], [[10, 20], [11]], input_tokens=1)
    assert read.logprobs["A"] == pytest.approx(math.log(0.3))


def test_ids_answered_as_text_are_read_by_text() -> None:
    """A server that ignores return_tokens_as_token_ids: read by text, not refused."""
    first = {**entry("Z", -0.1), "top_logprobs": [entry("Z", -0.1), entry("A", -3.0), entry("B", -4.0)]}
    read = parse_first_token(first, ["A", "B"], [[10], [11]], input_tokens=1)
    assert read.logprobs == pytest.approx({"A": -3.0, "B": -4.0})


def test_two_tokens_with_the_same_text_both_count() -> None:
    first = {**entry("A", math.log(0.3)),
             "top_logprobs": [entry("A", math.log(0.3)), entry("A", math.log(0.2)), entry(" B", math.log(0.1)),
                              entry("ĠB", math.log(0.05))]}
    read = parse_first_token(first, ["A", "B"], None, input_tokens=1)
    assert read.logprobs["A"] == pytest.approx(math.log(0.5))
    assert read.logprobs["B"] == pytest.approx(math.log(0.15))
    assert read.argmax_is_label is True


def test_a_label_below_a_full_top_list_is_bounded_by_its_last_entry() -> None:
    top = [entry(f"w{i}", -0.5 - i * 0.1) for i in range(TOP_LOGPROBS - 1)] + [entry("A", -4.0)]
    first = {**top[0], "top_logprobs": top}
    read = parse_first_token(first, ["A", "B", "C"], None, input_tokens=1)
    assert read.logprobs == {"A": -4.0, "B": -4.0, "C": -4.0}
    assert read.bounded == ("B", "C")
    assert read.label_mass == pytest.approx(math.exp(-4.0))  # bounded labels are not counted
    assert read.argmax_is_label is False


def test_a_label_missing_from_a_short_list_is_not_guessed() -> None:
    first = {**entry("A", -0.1), "top_logprobs": [entry("A", -0.1), entry("x", -3.0)]}
    read = parse_first_token(first, ["A", "B"], None, input_tokens=1)
    assert "B" not in read.logprobs and read.bounded == ()


def test_each_dialect_turns_thinking_off_in_its_own_words() -> None:
    options = CallOptions(timeout=1, max_reply_bytes=1024, tenant_salt="salt")
    messages = [{"role": "user", "content": "x"}]
    vllm = OpenAILogprobsReader("http://x", "m", options, dialect="vllm").request_body(
        messages, [[1], [2]], template_kwargs={"custom": 1, "enable_thinking": None})
    assert vllm["chat_template_kwargs"] == {"custom": 1, "enable_thinking": False}
    assert vllm["add_generation_prompt"] is True and vllm["continue_final_message"] is False
    assert vllm["logprob_token_ids"] == [1, 2] and vllm["return_tokens_as_token_ids"] is True
    assert "allowed_token_ids" not in vllm and vllm["cache_salt"] == "salt"
    ollama = OpenAILogprobsReader("http://x", "m", options, dialect="ollama").request_body(messages)
    assert ollama["reasoning_effort"] == "none" and ollama["top_logprobs"] == 20
    assert not {"chat_template_kwargs", "logprob_token_ids", "cache_salt"} & set(ollama)
    plain = OpenAILogprobsReader("http://x", "m", options, dialect="openai").request_body(messages)
    assert set(plain) == {"model", "messages", "max_tokens", "temperature", "logprobs", "top_logprobs", "stream"}
    with pytest.raises(ValueError):
        OpenAILogprobsReader("http://x", "m", options, dialect="tgi")
