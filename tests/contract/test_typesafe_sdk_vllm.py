"""TypeSafe's official SDK, unchanged, through Arbiter to vLLM 0.33.0's real front end (and to the
vLLM emulator: the ``target`` fixtures of test_vllm_frontend.py), with its default zstd."""

from __future__ import annotations

import math

from typesafe_sdk import Choice, Noul, RetryPolicy, Score, SystemOneResponse, TypeSafeClient

from tests.contract import test_vllm_frontend as frontend
from tests.contract.conftest import MODEL
from tests.contract.test_vllm_frontend import Target

# The emulator, then the real front end (their fixtures, shared with test_vllm_frontend.py).
target, emulator_target = frontend.target, frontend.emulator_target

TICKET = {"ticket": "My card was charged twice. " * 60}  # over 1 KiB: the SDK compresses it


def system_one(target: Target, questions: dict[str, Choice | Noul | Score]) -> SystemOneResponse:
    with TypeSafeClient(api_key=target.stack.project_key, base_url=target.stack.gateway.url,
                        model=MODEL, retry=RetryPolicy(max_retries=0), timeout=60) as client:
        return client.system_one(state=TICKET, questions=questions)


def _sums_to_one(probabilities: dict[str, float] | dict[int, float]) -> None:
    assert math.isclose(math.fsum(probabilities.values()), 1.0, rel_tol=1e-9), probabilities


def test_the_sdks_plain_decision(target: Target) -> None:
    result = system_one(target, {
        "team": Choice(instructions="Which team?", criteria={"billing": "payments", "shipping": None}),
        "urgent": Noul(instructions="Reply within the hour?"),
        "tone": Score(instructions="How upset?", criteria=["calm", "annoyed", "furious"]),
    })
    assert result.model == MODEL and list(result.answers) == ["team", "urgent", "tone"]
    assert result.choices["team"].choice in {"billing", "shipping"}
    _sums_to_one(result.choices["team"].probabilities)
    _sums_to_one(result.scores["tone"].probabilities)
    assert 0 <= result.nouls["urgent"].noul <= 1


def test_the_sdks_structured_instructions_and_criteria(target: Target) -> None:
    result = system_one(target, {
        "team": Choice(instructions={"task": "route the ticket", "teams": ["billing", "shipping"]},
                       criteria={"billing": {"handles": ["payments", "refunds"]}, "shipping": ["parcels"]}),
        "urgent": Noul(instructions=["Reply within the hour?"], criteria={"true": {"when": "money moves"}}),
        "tone": Score(instructions="How upset?", criteria=[{"level": "calm"}, "annoyed", ["furious"]]),
    })
    assert list(result.answers) == ["team", "urgent", "tone"]
    assert result.choices["team"].choice in {"billing", "shipping"}
    assert set(result.scores["tone"].probabilities) == {0, 1, 2}


def test_the_sdks_default_model_through_an_alias(target: Target) -> None:
    """``model`` left at the SDK's default (``jev-latest``), an alias an admin pointed at the model."""
    with target.client("admin") as admin:
        created = admin.post("/admin/aliases", json={"alias": "jev-latest", "model": MODEL})
        assert created.status_code == 201, created.text
    with TypeSafeClient(api_key=target.stack.project_key, base_url=target.stack.gateway.url,
                        retry=RetryPolicy(max_retries=0), timeout=60) as client:
        result = client.system_one(state=TICKET, questions={
            "urgent": Noul(instructions="Reply within the hour?")})
    assert result.model == "jev-latest" and 0 <= result.nouls["urgent"].noul <= 1
