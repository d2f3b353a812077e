"""Content-free calibration of label reading (app/routing/strategies/calibration.py): a model's bias
towards a label, read on states that say nothing, divided out of its answers."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from app.errors import InvalidRequest
from app.routing.backends import calibrates
from app.routing.strategies import calibration, labels
from app.routing.strategies.label_backend import LabelBackend
from app.routing.strategies.partitioned import PartitionedLru
from infra_adapters.base import CallOptions

TEAMS = {"billing": "payments", "shipping": "parcels", "technical": "bugs"}
QUESTION = {"type": "choice", "instructions": "Which team?", "criteria": TEAMS}


@dataclasses.dataclass
class Read:
    logprobs: Mapping[str, float]
    input_tokens: int = 10
    cached_tokens: int = 0
    argmax_is_label: bool | None = True
    bounded: Sequence[str] = ()

    @property
    def label_mass(self) -> float:
        return min(1.0, math.fsum(math.exp(v) for v in self.logprobs.values()))


class BiasedReader:
    """A model that says its second label for nothing (0.8), and reads evidence for the first in a
    real state."""

    def __init__(self) -> None:
        self.states: list[str] = []

    async def read(self, messages: list[dict[str, Any]], labels: Sequence[str],
                   token_ids: Sequence[Sequence[int]] | None = None,
                   template_kwargs: Mapping[str, Any] | None = None) -> Read:
        state = messages[-1]["content"].split("\n\n")[0]
        self.states.append(state)
        empty = state in calibration.CONTENT_FREE_STATES
        # The first three labels of any question: choices A B C, levels 0 1 2, yes no.
        probs = [0.1, 0.8, 0.1] if empty else [0.3, 0.6, 0.1]
        return Read({label: math.log(p) for label, p in zip(labels, probs)})


def decide(reader: Any, body: dict[str, Any], baselines: calibration.Baselines | None,
           salt: str | None = None, partition: str | None = None) -> dict[str, Any]:
    return asyncio.run(labels.decide(body, reader, baselines=baselines, salt=salt, partition=partition))


def test_the_bias_read_on_empty_states_is_divided_out() -> None:
    body = {"state": "I was charged twice", "questions": {"team": QUESTION}}
    plain = decide(BiasedReader(), body, None)
    assert plain["answers"]["team"]["choice"] == "shipping"  # the model's favourite letter, B
    assert "calibrated" not in plain["diagnostics"]["team"]

    reader = BiasedReader()
    answer = decide(reader, body, calibration.Baselines())
    team = answer["answers"]["team"]
    # 0.3/0.1, 0.6/0.8, 0.1/0.1 -> 3, 0.75, 1 over 4.75
    assert team["choice"] == "billing"
    assert team["probabilities"] == pytest.approx({"billing": 3 / 4.75, "shipping": 0.75 / 4.75,
                                                   "technical": 1 / 4.75})
    assert team["confidence"] == pytest.approx(3 / 4.75 * 1.0)
    assert answer["diagnostics"]["team"] == {"label_mass": pytest.approx(1.0), "argmax_is_label": True,
                                             "calibrated": True}
    assert sorted(reader.states) == sorted(["I was charged twice", *calibration.CONTENT_FREE_STATES])
    # The baseline's reads are work done for this request: they count in its usage.
    assert answer["usage"]["input_tokens"] == 40 and answer["usage"]["output_tokens"] == 4


def test_a_baseline_is_read_once_per_prompt_and_salt() -> None:
    baselines = calibration.Baselines()
    reader = BiasedReader()
    body = {"state": "ticket one", "questions": {"team": QUESTION}}
    decide(reader, body, baselines, salt="p1")
    second = decide(reader, {**body, "state": "ticket two"}, baselines, salt="p1")
    assert reader.states.count("N/A") == 1 and len(baselines) == 1
    assert second["usage"] == {"input_tokens": 10, "output_tokens": 1, "input_tokens_details": {"cached_tokens": 0}}
    # Another project's first request reads its own: a kept baseline would tell it by its speed
    # that someone asked this question before.
    decide(reader, body, baselines, salt="p2")
    assert reader.states.count("N/A") == 2 and len(baselines) == 2
    # Anything of the prompt but the state makes another baseline.
    other = {"type": "choice", "instructions": "Which team, really?", "criteria": TEAMS}
    decide(reader, {**body, "questions": {"team": other}}, baselines, salt="p1")
    decide(reader, {**body, "instructions": "Be brief."}, baselines, salt="p1")
    assert len(baselines) == 4


def test_baselines_kept_are_bounded_least_recently_used_first() -> None:
    baselines = calibration.Baselines(kept=2)
    reader = BiasedReader()

    def ask(instructions: str) -> None:
        question = {**QUESTION, "instructions": instructions}
        decide(reader, {"state": "s", "questions": {"q": question}}, baselines)

    ask("one"), ask("two"), ask("one"), ask("three")  # "two" is the least recently used
    assert len(baselines) == 2
    reads = reader.states.count("N/A")
    ask("one")
    assert reader.states.count("N/A") == reads
    ask("two")
    assert reader.states.count("N/A") == reads + 1


def test_one_projects_many_questions_never_evict_anothers_baselines() -> None:
    """Issue 30: with one LRU per model, a tenant's 64-question requests pushed another's baselines
    out, and that tenant paid the three content-free reads again (counted against its limits)."""
    baselines = calibration.Baselines(kept=64)
    reader = BiasedReader()
    body = {"state": "ticket one", "questions": {"team": QUESTION}}
    first = decide(reader, body, baselines, salt="b", partition="project-b")
    assert first["usage"]["input_tokens"] == 40  # the read and its three content-free reads
    many = {f"q{i}": {**QUESTION, "instructions": f"Which team, {i}?"} for i in range(64)}
    for turn in range(3):  # project A: 192 questions, three times B's whole bound
        decide(reader, {"state": "s", "questions": {f"{k}-{turn}": {**q, "instructions": f"{q['instructions']}{turn}"}
                                                   for k, q in many.items()}},
               baselines, salt="a", partition="project-a")
    assert baselines._known.size_of("project-a") == 64  # A is held to its own bound
    second = decide(reader, {**body, "state": "ticket two"}, baselines, salt="b", partition="project-b")
    assert second["usage"]["input_tokens"] == 10 and second["usage"]["output_tokens"] == 1


def test_the_partitioned_cache_keeps_each_bound() -> None:
    cache: PartitionedLru[str, int] = PartitionedLru(per_partition=2, total=3)
    for key, value in (("x", 1), ("y", 2), ("z", 3)):
        cache.put("a", key, value)
    assert cache.get("a", "x") is None and cache.get("a", "y") == 2 and len(cache) == 2
    assert cache.get("b", "y") is None  # another partition never sees a's entries
    cache.put("b", "x", 4)
    cache.put("c", "x", 5)  # over the total: the least recently used partition, a, gives its oldest
    assert len(cache) == 3 and cache.size_of("a") == 1 and cache.get("a", "y") == 2  # y was used last
    cache.put("c", "y", 6)  # b is now the least recently used partition
    assert cache.size_of("b") == 0 and len(cache) == 3
    with pytest.raises(ValueError):
        PartitionedLru(per_partition=3, total=2)


def test_every_question_type_is_calibrated_and_order_is_kept() -> None:
    body = {"state": "s", "questions": {
        "z": {"type": "score", "criteria": ["low", "mid", "high"]},
        "a": {"type": "noul", "instructions": "Refund?"},
        "m": QUESTION}}
    answer = decide(BiasedReader(), body, calibration.Baselines())
    assert list(answer["answers"]) == ["z", "a", "m"]
    for qid, item in answer["answers"].items():
        assert math.isclose(sum(item["probabilities"].values()), 1.0), qid
        assert answer["diagnostics"][qid]["calibrated"] is True


def test_a_label_the_model_never_says_on_empty_states_does_not_win_by_division() -> None:
    assert calibration.calibrated([0.5, 0.5], [1.0, 0.0]) == pytest.approx(
        [0.5 / 1.0 / (0.5 + 0.5 / calibration.FLOOR), 1 - 0.5 / (0.5 + 0.5 / calibration.FLOOR)])
    assert calibration.calibrated([0.0, 0.0], [0.5, 0.5]) == [0.0, 0.0]  # nothing to renormalise


def test_an_unreadable_label_on_an_empty_state_is_the_same_400() -> None:
    class Blind(BiasedReader):
        async def read(self, messages: list[dict[str, Any]], labels: Sequence[str],
                       token_ids: Sequence[Sequence[int]] | None = None,
                       template_kwargs: Mapping[str, Any] | None = None) -> Read:
            read = await super().read(messages, labels, token_ids, template_kwargs)
            if self.states[-1] == "[MASK]":
                return Read({k: v for k, v in read.logprobs.items() if k != "C"})
            return read

    baselines = calibration.Baselines()
    with pytest.raises(InvalidRequest, match="C cannot be read exactly"):
        decide(Blind(), {"state": "s", "questions": {"team": QUESTION}}, baselines)
    assert len(baselines) == 0  # nothing half-read is kept


@pytest.mark.parametrize(("setting", "service_type", "expected"), [
    ("local", "local", True), ("local", "vllm", False), ("local", "openai", False),
    ("all", "vllm", True), ("off", "local", False)])
def test_which_models_are_calibrated(setting: str, service_type: str, expected: bool) -> None:
    assert calibrates(setting, service_type) is expected


def test_a_callers_cache_salt_stays_inside_its_projects_bound() -> None:
    """The baselines' partition is the project's own salt: a caller varying its request's
    cache_salt makes baselines of its own, but within its project's bound, never a partition per
    value that would push other projects' baselines out."""

    class Reader:
        def __init__(self) -> None:
            self.biased = BiasedReader()

        async def read_with(self, options: CallOptions, messages: list[dict[str, Any]], labels: Sequence[str],
                            token_ids: Sequence[Sequence[int]] | None = None,
                            template_kwargs: Mapping[str, Any] | None = None) -> Read:
            assert options.partition == "project-a" and options.project_key == "project-a"
            return await self.biased.read(messages, labels, token_ids, template_kwargs)

        async def tokenize(self, text: str) -> list[int] | None:
            return None

        async def reply_label_ids(self, labels: Sequence[str]) -> dict[str, list[int]] | None:
            return None

        async def aclose(self) -> None:
            return None

    class Inner:
        kind, url = "local", "package:test"

    backend = LabelBackend(Inner(), "m", Reader(), calibrate=True)  # type: ignore[arg-type]
    body = {"state": "s", "questions": {"team": QUESTION}}

    async def ask() -> None:
        for salt in ("x1", "x2", "x3"):
            await backend.decide({**body, "cache_salt": salt}, CallOptions(10, 1 << 20, tenant_salt="project-a"))

    asyncio.run(ask())
    assert backend.baselines is not None
    assert backend.baselines._known.size_of("project-a") == 3 and len(backend.baselines) == 3
