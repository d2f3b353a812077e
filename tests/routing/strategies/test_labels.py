"""Label reading (issue 10) against the vLLM emulator's chat logprobs, over real HTTP."""

from __future__ import annotations

import asyncio
import json
import math
import string
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from app import jsonbody
from app.errors import InvalidRequest
from app.routing.strategies import labels
from app.routing.strategies.label_backend import spelled_label_ids
from infra_adapters.base import CallOptions
from infra_adapters.emulators.answers import distribution
from infra_adapters.emulators.generation import prompt_tokens
from infra_adapters.emulators.logprobs_chat import decode, position_logprobs, token_id
from infra_adapters.emulators.server import EmulatorServer
from infra_adapters.emulators.vllm import VllmState
from infra_adapters.openai_logprobs import TOP_LOGPROBS, OpenAILogprobsReader
from tests.support import decision

MODEL = "Qwen/Qwen3-0.6B"
Emulator = tuple[EmulatorServer, VllmState]
OPTIONS = CallOptions(timeout=10, max_reply_bytes=1 << 20)


def run(server: EmulatorServer, body: dict[str, Any], token_ids: Mapping[str, Sequence[int]] | None = None,
        salt: str | None = None, reader_class: type[OpenAILogprobsReader] = OpenAILogprobsReader,
        text: labels.ValueText = labels.compact_text) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        options = CallOptions(timeout=10, max_reply_bytes=1 << 20, tenant_salt=salt)
        reader = reader_class(server.url, MODEL, options)
        try:
            return await labels.decide(body, reader, token_ids, text)
        finally:
            await reader.aclose()

    return asyncio.run(go())


def chats(state: VllmState) -> list[dict[str, Any]]:
    return [r.json for r in state.requests if r.path == "/v1/chat/completions"]


def prompt_of(request: dict[str, Any]) -> str:
    """The read's user message (the last message: the chat ends at the generation prompt)."""
    message = request["messages"][-1]
    assert message["role"] == "user"
    return str(message["content"])


def read_of(state: VllmState, question_line: str) -> dict[str, Any]:
    """The read whose prompt has this line (a question's ``Question: ...`` heading)."""
    (request,) = [r for r in chats(state) if question_line in prompt_of(r).split("\n")]
    return request


def expected(request: dict[str, Any], qtype: str, names: Sequence[str]) -> list[float]:
    """The emulator's label distribution for the prompt it was sent."""
    return distribution(prompt_of(request), qtype, None, list(names)).probs


def argmax_token(request: dict[str, Any], state: VllmState) -> str:
    """The token the emulator samples for this read (greedy, no mask: the model's argmax)."""
    raw = position_logprobs(request["messages"], state.label_mass, state.label_space_share)
    return decode(min(raw, key=lambda tid: (-raw[tid], tid)))


# What label reading finds with the emulator's /tokenize (label_backend.spelled_label_ids): per
# label, the ids of its one-token spellings, as written then with a leading space.
ALL_IDS = {label: [token_id(spelling) for spelling in labels.spellings(label)] for label in labels.ALL_LABELS}


def ids_of(*names: str) -> list[int]:
    """The ids sent for these labels: each one's own token, then its leading-space variant."""
    return [token_id(spelling) for name in names for spelling in (name, " " + name)]


def test_prompts_state_first_labels_and_instruction(vllm: Emulator) -> None:
    server, state = vllm
    run(server, decision(MODEL))
    sent = chats(state)
    assert len(sent) == 3  # one read per question
    state_text = '{"ticket": "My card was charged twice."}'  # json.dumps's separators, first
    for request in sent:
        assert [m["role"] for m in request["messages"]] == ["user"]  # no system message, no prefill
    questions = [
        ["Question: Which team?", "A: billing - payments and refunds", "B: shipping",
         "Answer with the letter of one option only."],
        ["Question: Reply within the hour?", "yes: money is moving", "no", "Answer with yes or no only."],
        ["Question: How upset?", "0: calm", "1: annoyed", "2: furious", "Answer with the number of one level only."],
    ]
    assert sorted(prompt_of(r) for r in sent) == sorted(f"{state_text}\n\n" + "\n".join(q) for q in questions)
    assert labels.REPLY_INSTRUCTIONS == {"choice": "Answer with the letter of one option only.",
                                         "noul": "Answer with yes or no only.",
                                         "score": "Answer with the number of one level only."}
    for request in sent:
        assert request["max_tokens"] == 1 and request["temperature"] == 0
        assert request["logprobs"] is True and request["top_logprobs"] == 20
        assert request["add_generation_prompt"] is True and request["continue_final_message"] is False
        assert request["chat_template_kwargs"] == {"enable_thinking": False}
        for absent in ("logprob_token_ids", "return_tokens_as_token_ids", "allowed_token_ids", "cache_salt"):
            assert absent not in request


def test_top_level_instructions_are_a_system_message_and_template_kwargs_go_along(vllm: Emulator) -> None:
    server, state = vllm
    body = decision(MODEL, instructions="You triage support tickets.",
                    chat_template_kwargs={"custom_flag": 1, "enable_thinking": False},
                    state={"ticket": "Café: charged twice", "amounts": [12.5, 12.5]},
                    questions={"spam": {"type": "noul"}})
    out = run(server, body)
    (request,) = chats(state)
    state_text = json.dumps(body["state"], ensure_ascii=False)  # non-ASCII kept
    assert "Café" in state_text
    assert request["messages"] == [
        {"role": "system", "content": "You triage support tickets."},
        {"role": "user", "content": f"{state_text}\n\nyes\nno\n{labels.REPLY_INSTRUCTIONS['noul']}"},
    ]  # no instructions on the question: no "Question:" line
    assert request["chat_template_kwargs"] == {"custom_flag": 1, "enable_thinking": False}
    probs = expected(request, "noul", ["yes", "no"])
    assert out["answers"]["spam"]["noul"] == pytest.approx(probs[0])


def test_string_state_is_sent_as_is(vllm: Emulator) -> None:
    server, state = vllm
    run(server, decision(MODEL, state="Charged twice\nplease help"), salt="proj-1")
    for request in chats(state):
        assert prompt_of(request).startswith("Charged twice\nplease help\n\n")
        assert request["cache_salt"] == "proj-1"


# Instructions and descriptions of every JSON kind, parsed as the gateway parses them (floats and
# huge integers kept as their text).
STRUCTURED = jsonbody.loads("""{"model": "m", "state": "Charged twice", "instructions": {"role": "triage"},
 "questions": {
  "team": {"type": "choice", "instructions": {"ask": "Which team?", "weights": [1, 2.50, 1e3]},
           "criteria": {"billing": {"covers": ["refunds", "Café"]}, "shipping": null, "legal": 0,
                        "other": ""}},
  "urgent": {"type": "noul", "instructions": ["within", "the", "hour"],
             "criteria": {"true": true, "false": {}}},
  "tone": {"type": "score", "instructions": 12345678901234567890123,
           "criteria": [{"calm": null}, false, 3.0, "furious"]},
  "bare": {"type": "noul", "instructions": null, "criteria": {"true": null}}}}""".encode())


def user_prompts(state: VllmState) -> dict[str, str]:
    """Each read's user message, by its question's first option line."""
    return {prompt_of(r).split("\n")[3]: prompt_of(r) for r in chats(state)}


def test_structured_instructions_and_descriptions_are_compact_json(vllm: Emulator) -> None:
    server, state = vllm
    run(server, STRUCTURED)
    systems = {r["messages"][0]["content"] for r in chats(state)}
    assert systems == {'{"role":"triage"}'}
    assert sorted(user_prompts(state).values()) == sorted([
        ('Charged twice\n\nQuestion: {"ask":"Which team?","weights":[1,2.50,1e3]}\n'
         'A: billing - {"covers":["refunds","Café"]}\nB: shipping\nC: legal - 0\nD: other\n'
         "Answer with the letter of one option only."),
        'Charged twice\n\nQuestion: ["within","the","hour"]\nyes: true\nno: {}\nAnswer with yes or no only.',
        ('Charged twice\n\nQuestion: 12345678901234567890123\n0: {"calm":null}\n1: false\n2: 3.0\n3: furious\n'
         "Answer with the number of one level only."),
        "Charged twice\n\nyes\nno\nAnswer with yes or no only.",
    ])


def test_on_vllm_they_are_written_as_vllms_own_reader_writes_them(vllm: Emulator) -> None:
    """question_types.py writes a non-string with ``str()`` of what vLLM's JSON parser gave."""
    server, state = vllm
    run(server, STRUCTURED, text=labels.vllm_text)
    assert {r["messages"][0]["content"] for r in chats(state)} == {"{'role': 'triage'}"}
    assert sorted(user_prompts(state).values()) == sorted([
        ("Charged twice\n\nQuestion: {'ask': 'Which team?', 'weights': [1, 2.5, 1000.0]}\n"
         "A: billing - {'covers': ['refunds', 'Café']}\nB: shipping\nC: legal - 0\nD: other\n"
         "Answer with the letter of one option only."),
        "Charged twice\n\nQuestion: ['within', 'the', 'hour']\nyes: True\nno: {}\nAnswer with yes or no only.",
        ("Charged twice\n\nQuestion: 12345678901234567890123\n0: {'calm': None}\n1: False\n2: 3.0\n3: furious\n"
         "Answer with the number of one level only."),
        "Charged twice\n\nyes\nno\nAnswer with yes or no only.",
    ])


@pytest.mark.parametrize("raw", [b'{"a": [1, 2.50, -0, -0.0, 1E400, 123456789012345678901234567890]}',
                                 rb'["\u00e9\n\"q\" \\", true, false, null, {}, []]', b"7", b"-1.5e-3",
                                 b"[" + b"9" * 5000 + b"]"])
def test_vllm_text_is_str_of_what_pythons_json_parser_gives(raw: bytes) -> None:
    value = jsonbody.loads(b'{"v": ' + raw + b"}")["v"]
    try:
        expected = str(json.loads(raw))
    except ValueError:  # past Python's 4,300-digit limit for int(): the digits as they came
        expected = "[" + "9" * 5000 + "]"
    assert labels.vllm_text(value) == expected


def test_string_values_are_shown_as_they_are_by_both() -> None:
    for text in (labels.compact_text, labels.vllm_text):
        assert text("Which team?") == "Which team?" and text("") == ""
        question = {"type": "choice", "instructions": "Which?", "criteria": {"a": "first", "b": None}}
        assert labels.question_text(question, ("A", "B"), text) == (
            "Question: Which?\nA: a - first\nB: b\nAnswer with the letter of one option only.")


def test_the_emulators_tokenizer_gives_every_label_both_spellings(vllm: Emulator) -> None:
    server, _ = vllm

    async def go() -> dict[str, list[int]] | None:
        reader = OpenAILogprobsReader(server.url, MODEL, OPTIONS)
        try:
            return await spelled_label_ids(reader)
        finally:
            await reader.aclose()

    assert asyncio.run(go()) == ALL_IDS


def test_token_ids_sent_and_the_maths(vllm: Emulator) -> None:
    server, state = vllm
    state.label_mass = 0.75
    out = run(server, decision(MODEL), ALL_IDS)
    team, urgent = read_of(state, "Question: Which team?"), read_of(state, "Question: Reply within the hour?")
    tone = read_of(state, "Question: How upset?")
    assert team["logprob_token_ids"] == ids_of("A", "B")
    assert urgent["logprob_token_ids"] == ids_of("yes", "no")
    assert tone["logprob_token_ids"] == ids_of("0", "1", "2")
    for request in (team, urgent, tone):
        assert request["return_tokens_as_token_ids"] is True
        assert "allowed_token_ids" not in request  # no mask: argmax_is_label can be false

    answers = out["answers"]
    probs = expected(team, "choice", ["A", "B"])
    best = max(range(len(probs)), key=lambda i: (probs[i], -i))
    assert answers["team"]["choice"] == ["billing", "shipping"][best]
    assert answers["team"]["probabilities"] == pytest.approx({"billing": probs[0], "shipping": probs[1]})
    assert answers["team"]["confidence"] == pytest.approx(probs[best] * 0.75)

    probs = expected(urgent, "noul", ["yes", "no"])
    assert answers["urgent"]["noul"] == pytest.approx(probs[0])
    assert answers["urgent"]["probabilities"] == pytest.approx({"yes": probs[0], "no": probs[1]})
    assert answers["urgent"]["confidence"] == pytest.approx(max(probs) * 0.75)

    probs = expected(tone, "score", ["0", "1", "2"])
    assert answers["tone"]["score"] == pytest.approx(sum(i * p for i, p in enumerate(probs)))
    assert answers["tone"]["legend"] == {"0": "calm", "1": "annoyed", "2": "furious"}
    assert answers["tone"]["probabilities"] == pytest.approx({str(i): p for i, p in enumerate(probs)})
    assert answers["tone"]["confidence"] == pytest.approx(max(probs) * 0.75)
    assert math.fsum(answers["tone"]["probabilities"].values()) == pytest.approx(1.0)

    for qid, request, names in (("team", team, "AB"), ("urgent", urgent, ("yes", "no")), ("tone", tone, "012")):
        argmax = argmax_token(request, state)
        assert out["diagnostics"][qid] == {"label_mass": pytest.approx(0.75),
                                           "argmax_is_label": argmax.lstrip() in names}
    # the reads' prompt tokens summed (the emulator counts them with prompt_tokens); one output each
    assert out["usage"] == {"input_tokens": sum(prompt_tokens(r["messages"]) for r in chats(state)),
                            "output_tokens": 3, "input_tokens_details": {"cached_tokens": 0}}


def test_leading_space_variants_are_summed(vllm: Emulator) -> None:
    server, state = vllm
    state.label_space_share = 0.4
    out = run(server, decision(MODEL))
    team = read_of(state, "Question: Which team?")
    probs = expected(team, "choice", ["A", "B"])
    assert out["answers"]["team"]["probabilities"] == pytest.approx(
        {"billing": probs[0], "shipping": probs[1]})
    assert out["diagnostics"]["team"]["label_mass"] == pytest.approx(state.label_mass)


def test_leading_space_variants_are_read_by_token_id_whatever_their_rank(vllm: Emulator) -> None:
    server, state = vllm
    state.label_space_share, state.label_mass = 0.9, 0.95  # most weight is on " A"
    out = run(server, choice_of(24), ALL_IDS)
    (request,) = chats(state)
    assert request["logprob_token_ids"] == ids_of(*string.ascii_uppercase[:24])
    probs = expected(request, "choice", string.ascii_uppercase[:24])
    # 24 labels in two spellings: most " X" are out of the top 20, yet every one counts in full.
    assert list(out["answers"]["pick"]["probabilities"].values()) == pytest.approx(probs)
    assert out["diagnostics"]["pick"]["label_mass"] == pytest.approx(0.95)
    assert "bounded_labels" not in out["diagnostics"]["pick"]


class _SpacedATakesTwoTokens(OpenAILogprobsReader):
    """The emulator's tokenizer, except that " A" is two tokens (a space, then "A")."""

    async def tokenize(self, text: str) -> list[int] | None:
        if text == " A":
            return [5032, token_id("A")]
        return await super().tokenize(text)


def test_a_one_token_label_whose_spaced_spelling_is_two_tokens_is_read_as_written(vllm: Emulator) -> None:
    server, state = vllm

    async def go() -> dict[str, list[int]] | None:
        reader = _SpacedATakesTwoTokens(server.url, MODEL, OPTIONS)
        try:
            return await spelled_label_ids(reader)
        finally:
            await reader.aclose()

    found = asyncio.run(go())
    assert found is not None and found["A"] == [token_id("A")] and found["B"] == ids_of("B")
    out = run(server, decision(MODEL), found)
    team = read_of(state, "Question: Which team?")
    assert team["logprob_token_ids"] == [token_id("A"), *ids_of("B")]
    probs = expected(team, "choice", ["A", "B"])
    assert out["answers"]["team"]["probabilities"] == pytest.approx({"billing": probs[0], "shipping": probs[1]})


@pytest.mark.parametrize("by_id", [False, True], ids=["by-text", "by-id"])
def test_low_label_mass_means_argmax_is_not_a_label(vllm: Emulator, by_id: bool) -> None:
    server, state = vllm
    state.label_mass = 0.05
    out = run(server, decision(MODEL), ALL_IDS if by_id else None)
    for request in chats(state):
        assert argmax_token(request, state).lstrip() not in labels.ALL_LABELS  # the emulator's argmax
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
    assert request["logprob_token_ids"] == ids_of(*string.ascii_uppercase)
    probs = expected(request, "choice", string.ascii_uppercase)
    assert list(out["answers"]["pick"]["probabilities"].values()) == pytest.approx(probs)


def test_27_options_is_a_400_before_any_read(vllm: Emulator) -> None:
    server, state = vllm
    with pytest.raises(InvalidRequest) as caught:
        run(server, choice_of(27), ALL_IDS)
    assert caught.value.status == 400
    assert "at most 26 options" in caught.value.message
    assert "softmaxes over different subsets" in caught.value.message
    assert chats(state) == []


def test_label_out_of_a_full_top_list_without_token_ids_is_bounded(vllm: Emulator) -> None:
    server, state = vllm
    out = run(server, choice_of(22))  # 22 labels and fillers: some fall out of the top 20
    (request,) = chats(state)
    names = string.ascii_uppercase[:22]
    # What the emulator reports: its 20 best tokens (the sampled one among them).
    raw = position_logprobs(request["messages"], state.label_mass, state.label_space_share)
    top = {decode(tid): raw[tid] for tid in sorted(raw, key=lambda tid: (-raw[tid], tid))[:TOP_LOGPROBS]}
    floor = min(top.values())
    bounded = [label for label in names if label not in top]
    assert bounded  # the case under test: some labels are ranked below the last reported token
    logprobs = [top.get(label, floor) for label in names]
    total = math.fsum(math.exp(lp) for lp in logprobs)
    probs = [math.exp(lp) / total for lp in logprobs]
    mass = math.fsum(math.exp(top[label]) for label in names if label in top)  # exact labels only

    pick, diagnostics = out["answers"]["pick"], out["diagnostics"]["pick"]
    assert diagnostics == {"label_mass": pytest.approx(mass), "bounded_labels": bounded,
                           "argmax_is_label": argmax_token(request, state) in names}
    assert list(pick["probabilities"].values()) == pytest.approx(probs)
    best = max(range(len(probs)), key=lambda i: (probs[i], -i))
    assert pick["choice"] == f"option{best}"
    assert pick["confidence"] == pytest.approx(probs[best] * mass)


class _ShortTopList(OpenAILogprobsReader):
    """A server that reports fewer top logprobs than the 20 asked."""

    def request_body(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {**super().request_body(*args, **kwargs), "top_logprobs": 10}


def test_label_out_of_a_short_top_list_without_token_ids_is_a_400(vllm: Emulator) -> None:
    server, _ = vllm
    with pytest.raises(InvalidRequest) as caught:
        run(server, choice_of(22), reader_class=_ShortTopList)  # 10 entries: no bound is known
    assert caught.value.status == 400
    assert "cannot be read exactly" in caught.value.message


@pytest.mark.parametrize("token_ids", [{k: v for k, v in ALL_IDS.items() if k != "yes"}, {**ALL_IDS, "yes": []}],
                         ids=["missing", "empty"])
def test_label_that_is_not_one_token_is_a_400(vllm: Emulator, token_ids: dict[str, list[int]]) -> None:
    server, state = vllm
    with pytest.raises(InvalidRequest) as caught:
        run(server, decision(MODEL), token_ids)
    assert caught.value.status == 400
    assert "'yes' is not a single token" in caught.value.message
    assert chats(state) == []
