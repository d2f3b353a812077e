"""Fixtures: one Ollama and one vLLM emulator per module, reset between tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from infra_adapters.admin import admin_tls
from infra_adapters.emulators.ollama import (
    OllamaState,
    default_library,
    default_models,
    make_ollama_app,
)
from infra_adapters.emulators.server import EmulatorServer
from infra_adapters.emulators.vllm import VllmState, default_vllm_models, make_vllm_app

TIMEOUT = httpx.Timeout(3.0)


def sample_request(model: str) -> dict[str, Any]:
    return {
        "model": model,
        "state": {"ticket": "My card was charged twice."},
        "questions": {
            "team": {
                "type": "choice",
                "instructions": "Which team?",
                "criteria": {"billing": "payments and refunds", "shipping": None},
            },
            "urgent": {
                "type": "noul",
                "instructions": "Reply within the hour?",
                "criteria": {"true": "money is moving"},
            },
            "tone": {
                "type": "score",
                "instructions": "How upset?",
                "criteria": ["calm", "annoyed", "furious"],
            },
        },
    }


@pytest.fixture
def make_request() -> Any:
    """`make_request(model)`: a request with one question of each type."""
    return sample_request


@pytest.fixture(scope="module")
def ollama_server() -> Iterator[tuple[OllamaState, EmulatorServer]]:
    state = OllamaState()
    with EmulatorServer(make_ollama_app(state)) as server:
        yield state, server


@pytest.fixture(scope="module")
def vllm_server() -> Iterator[tuple[VllmState, EmulatorServer]]:
    state = VllmState()
    with EmulatorServer(make_vllm_app(state)) as server:
        yield state, server


@pytest.fixture
def ollama(ollama_server: tuple[OllamaState, EmulatorServer]) -> Iterator[OllamaState]:
    state, _ = ollama_server
    _reset_ollama(state)
    yield state
    _reset_ollama(state)


@pytest.fixture
def vllm(vllm_server: tuple[VllmState, EmulatorServer]) -> Iterator[VllmState]:
    state, _ = vllm_server
    _reset_vllm(state)
    yield state
    _reset_vllm(state)


@pytest.fixture
def ollama_client(
    ollama: OllamaState, ollama_server: tuple[OllamaState, EmulatorServer]
) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=ollama_server[1].url, timeout=TIMEOUT, verify=admin_tls()) as client:
        yield client


@pytest.fixture
def vllm_client(
    vllm: VllmState, vllm_server: tuple[VllmState, EmulatorServer]
) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=vllm_server[1].url, timeout=TIMEOUT, verify=admin_tls()) as client:
        yield client


def _reset_ollama(state: OllamaState) -> None:
    state.version = "0.35.0"
    state.models = default_models()
    state.library = default_library()
    state.required_bearer = None
    state.pull_seconds = 0.3
    state.pull_errors = {}
    state.show_errors = {}
    state.pulling.clear()
    state.stream_delay = 0.0
    state.faults.reset()
    state.requests.clear()


def _reset_vllm(state: VllmState) -> None:
    state.version = "0.11.0"
    state.models = default_vllm_models()
    state.required_bearer = None
    state.stream_delay = 0.0
    state.openai_decisions = True
    state.label_mass = 0.9
    state.label_space_share = 0.0
    state.prefix_caching = False
    state.read_prompts.clear()
    state.return_tokens_as_token_ids = False
    state.logprobs_mode = "raw_logprobs"
    state.faults.reset()
    state.requests.clear()
