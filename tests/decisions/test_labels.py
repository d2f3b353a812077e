"""Label reading (issue 10) against the vLLM emulator's chat logprobs, over real HTTP."""

from __future__ import annotations

import asyncio
import math
import string
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from app.decisions import labels
from app.errors import InvalidRequest
from infra_adapters.base import CallOptions
from infra_adapters.emulators.answers import distribution
from infra_adapters.emulators.generation import prompt_tokens
from infra_adapters.emulators.logprobs_chat import token_id
from infra_adapters.emulators.server import EmulatorServer
from infra_adapters.emulators.vllm import VllmState
from infra_adapters.openai_logprobs import OpenAILogprobsReader
from tests.support import decision

MODEL = "Qwen/Qwen3-0.6B"
Emulator = tuple[EmulatorServer, VllmState]


def run(server: EmulatorServer, body: dict[str, Any], token_ids: Mapping[str, Sequence[int]] | None = None,
        salt: str | None = None) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        options = CallOptions(timeout=10, max_reply_bytes=1 << 20, tenant_salt=salt)
        reader = OpenAILogprobsReader(server.url, MODEL, options)
        try:
            return await labels.decide(body, reader, token_ids)
        finally:
            await reader.aclose()

    return asyncio.run(go())


def chats(state: VllmState) -> list[dict[str, Any]]:
    return [r.json for r in state.requests if r.path == "/v1/chat/completions"]


def prompt_of(request: dict[str, Any]) -> str:
    return str(request["messages"][0]["content"])


def expected(request: dict[str, Any], qtype: str) -> tuple[list[str], list[float]]:
    """The emulator's label distribution for the prompt it was sent."""
    prompt = prompt_of(request)
    found = prompt.rsplit("\n", 1)[-1].removeprefix(labels.INSTRUCTION + " ").removesuffix(".").split(", ")
    return found, distribution(prompt, qtype, None, found).probs


# What label reading finds with the emulator's /tokenize: every spelling of every label, one token.
ALL_IDS = {spelling: [token_id(spelling)] for label in [*string.ascii_uppercase, *string.digits, "yes", "no"]
           for spelling in labels.spellings(label)}


def ids_of(*names: str) -> list[int]:
    """The ids sent for these labels: each one's own token, then its leading-space variant."""
    return [token_id(spelling) for name in names for spelling in (name, " " + name)]


def test_prompts_state_first_labels_and_instruction(vllm: Emulator) -> None:
    server, state = vllm
    run(server, decision(MODEL))
    sent = chats(state)
    assert len(sent) == 3  # one read per question
    prompts = [prompt_of(r) for r in sent]
    for prompt in prompts:
        assert prompt.startswith('{"ticket":"My card was charged twice."}\n\n')  # compact JSON, first
    by_q = {p.split("\n")[2]: p for p in prompts}
    assert by_q["Which team?"].endswith(
        "Options:\nA: billing - payments and refunds\nB: shipping\nAnswer with one label only: A, B.")
    assert by_q["Reply within the hour?"].endswith(
        "Options:\nyes: money is moving\nno\nAnswer with one label only: yes, no.")
    assert by_q["How upset?"].endswith(
        "Options:\n0: calm\n1: annoyed\n2: furious\nAnswer with one label only: 0, 1, 2.")
    for request in sent:
        assert request["messages"][1] == {"role": "assistant", "content": labels.PREFILL}
        assert request["max_tokens"] == 1 and request["temperature"] == 0
        assert request["logprobs"] is True and request["top_logprobs"] == 20
        assert request["continue_final_message"] is True and request["add_generation_prompt"] is False
        assert request["chat_template_kwargs"] == {"enable_thinking": False}
        assert "logprob_token_ids" not in request and "cache_salt" not in request


def test_string_state_is_sent_as_is(vllm: Emulator) -> None:
    server, state = vllm
    run(server, decision(MODEL, state="Charged twice\nplease help"), salt="proj-1")
    for request in chats(state):
        assert prompt_of(request).startswith("Charged twice\nplease help\n\n")
        assert request["cache_salt"] == "proj-1"


def test_token_ids_sent_and_the_maths(vllm: Emulator) -> None:
    server, state = vllm
    state.label_mass = 0.75
    out = run(server, decision(MODEL), ALL_IDS)
    sent = {r["messages"][0]["content"].split("\n")[2]: r for r in chats(state)}
    team, urgent, tone = sent["Which team?"], sent["Reply within the hour?"], sent["How upset?"]
    assert team["logprob_token_ids"] == team["allowed_token_ids"] == ids_of("A", "B")
    assert urgent["logprob_token_ids"] == ids_of("yes", "no")
    assert tone["logprob_token_ids"] == ids_of("0", "1", "2")

    answers = out["answers"]
    _, probs = expected(team, "choice")
    best = max(range(len(probs)), key=lambda i: (probs[i], -i))
    assert answers["team"]["choice"] == ["billing", "shipping"][best]
    assert answers["team"]["probabilities"] == pytest.approx({"billing": probs[0], "shipping": probs[1]})
    assert answers["team"]["confidence"] == pytest.approx(probs[best] * 0.75)

    _, probs = expected(urgent, "noul")
    assert answers["urgent"]["noul"] == pytest.approx(probs[0])
    assert answers["urgent"]["probabilities"] == pytest.approx({"yes": probs[0], "no": probs[1]})
    assert answers["urgent"]["confidence"] == pytest.approx(max(probs) * 0.75)

    _, probs = expected(tone, "score")
    assert answers["tone"]["score"] == pytest.approx(sum(i * p for i, p in enumerate(probs)))
    assert answers["tone"]["legend"] == {"0": "calm", "1": "annoyed", "2": "furious"}
    assert answers["tone"]["probabilities"] == pytest.approx({str(i): p for i, p in enumerate(probs)})
    assert math.fsum(answers["tone"]["probabilities"].values()) == pytest.approx(1.0)

    for qid in ("team", "urgent", "tone"):
        assert out["diagnostics"][qid] == {"label_mass": pytest.approx(0.75), "argmax_is_label": True}
    # the reads' prompt tokens summed (the emulator counts them with prompt_tokens); one output each
    assert out["usage"] == {"input_tokens": sum(prompt_tokens(r["messages"]) for r in chats(state)),
                            "output_tokens": 3, "input_tokens_details": {"cached_tokens": 0}}


def test_leading_space_variants_are_summed(vllm: Emulator) -> None:
    server, state = vllm
    state.label_space_share = 0.4
    out = run(server, decision(MODEL))
    team = next(r for r in chats(state) if "Which team?" in prompt_of(r))
    _, probs = expected(team, "choice")
    assert out["answers"]["team"]["probabilities"] == pytest.approx(
        {"billing": probs[0], "shipping": probs[1]})
    assert out["diagnostics"]["team"]["label_mass"] == pytest.approx(0.9)


def test_leading_space_variants_are_read_by_token_id_whatever_their_rank(vllm: Emulator) -> None:
    server, state = vllm
    state.label_space_share, state.label_mass = 0.9, 0.95  # after "Answer:", most weight is on " A"
    out = run(server, choice_of(24), ALL_IDS)
    (request,) = chats(state)
    assert request["logprob_token_ids"] == request["allowed_token_ids"] == ids_of(*string.ascii_uppercase[:24])
    _, probs = expected(request, "choice")
    # 24 labels in two spellings: most " X" are out of the top 20, yet every one counts in full.
    assert list(out["answers"]["pick"]["probabilities"].values()) == pytest.approx(probs)
    assert out["diagnostics"]["pick"]["label_mass"] == pytest.approx(0.95)


def test_a_one_token_label_whose_spaced_spelling_is_two_tokens_is_read_as_written(vllm: Emulator) -> None:
    server, state = vllm
    run(server, decision(MODEL), {**ALL_IDS, " A": [5032, token_id("A")]})
    team = next(r for r in chats(state) if "Which team?" in prompt_of(r))
    assert team["logprob_token_ids"] == [token_id("A"), *ids_of("B")]


def test_low_label_mass_means_argmax_is_not_a_label(vllm: Emulator) -> None:
    server, state = vllm
    state.label_mass = 0.05
    out = run(server, decision(MODEL))
    for qid in ("team", "urgent", "tone"):
        assert out["diagnostics"][qid] == {"label_mass": pytest.approx(0.05), "argmax_is_label": False}
    assert out["answers"]["team"]["confidence"] <= 0.05


def choice_of(n: int) -> dict[str, Any]:
    return decision(MODEL, questions={"pick": {"type": "choice", "instructions": "Pick one.",
                                               "criteria": {f"option{i}": None for i in range(n)}}})


def test_26_options_read_with_token_ids(vllm: Emulator) -> None:
    server, state = vllm
    out = run(server, choice_of(26), ALL_IDS)
    (request,) = chats(state)
    _, probs = expected(request, "choice")
    assert list(out["answers"]["pick"]["probabilities"].values()) == pytest.approx(probs)


def test_27_options_is_a_400_before_any_read(vllm: Emulator) -> None:
    server, state = vllm
    with pytest.raises(InvalidRequest) as caught:
        run(server, choice_of(27), ALL_IDS)
    assert caught.value.status == 400
    assert "at most 26 options" in caught.value.message
    assert "softmaxes over different subsets" in caught.value.message
    assert chats(state) == []


def test_label_out_of_top_logprobs_without_token_ids_is_a_400(vllm: Emulator) -> None:
    server, _ = vllm
    with pytest.raises(InvalidRequest) as caught:
        run(server, choice_of(22))  # 22 labels and fillers: some fall out of the top 20
    assert caught.value.status == 400
    assert "cannot be read exactly" in caught.value.message


def test_label_that_is_not_one_token_is_a_400(vllm: Emulator) -> None:
    server, state = vllm
    with pytest.raises(InvalidRequest) as caught:
        run(server, decision(MODEL), {**ALL_IDS, "yes": [9891, 17]})
    assert "'yes' is not a single token" in caught.value.message
    assert chats(state) == []
