"""The contract pass: vLLM 0.33.0's real front end (``vllm_frontend.py``, its engine stubbed) on
loopback, started with the contract virtualenv's Python.

``ARBITER_CONTRACT_PYTHON`` names that Python (``scripts/bootstrap-contract`` makes
``.venv-contract``; ``.ci/run`` sets it). Without it, the tests' real-vLLM cases skip and their
emulator cases still run; with it, a front end that does not start fails the pass: it never
passes silently.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support import free_port

HARNESS = Path(__file__).with_name("vllm_frontend.py")
MODEL = "qwen-tiny"
START_TIMEOUT = 240.0  # vLLM's imports and config take 15-30 s on two cores; three start at once
# The front ends the pass starts, by name: the flags each is served with.
FLAVOURS = {
    "plain": [],
    "token-ids": ["--return-tokens-as-token-ids"],
    "processed": ["--logprobs-mode", "processed_logprobs"],
    # An architecture vLLM has no read strategy for: /v1/systemone and /v1/decisions answer 501.
    "no-strategy": ["--stub-architecture", "LlamaForCausalLM"],
}


@dataclass
class Frontend:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def contract_python() -> str | None:
    return os.environ.get("ARBITER_CONTRACT_PYTHON") or None


def _start(python: str, flags: list[str], log: Path) -> Frontend:
    port = free_port()
    process = subprocess.Popen(
        [python, str(HARNESS), "--host", "127.0.0.1", "--port", str(port), "--served-model-name", MODEL,
         "--disable-uvicorn-access-log", *flags],
        stdout=log.open("wb"), stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return Frontend(f"http://127.0.0.1:{port}", process, log)


def _wait(frontend: Frontend, deadline: float) -> None:
    while time.monotonic() < deadline:
        if frontend.process.poll() is not None:
            raise RuntimeError(f"vLLM's front end exited ({frontend.process.returncode}):\n{frontend.tail()}")
        try:
            if httpx.get(frontend.url + "/v1/models", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"vLLM's front end did not answer within {START_TIMEOUT:g}s:\n{frontend.tail()}")


@pytest.fixture(scope="session")
def vllm_frontends() -> Iterator[dict[str, Frontend]]:
    """Every flavour of the real front end, started at once, stopped at the end of the session."""
    python = contract_python()
    if python is None:
        pytest.skip("vLLM's real front end: ARBITER_CONTRACT_PYTHON is not set (scripts/bootstrap-contract)")
    logs = Path(tempfile.mkdtemp(prefix="vllm-contract-"))
    started = {name: _start(python, flags, logs / f"{name}.log") for name, flags in FLAVOURS.items()}
    try:
        deadline = time.monotonic() + START_TIMEOUT
        try:
            for frontend in started.values():
                _wait(frontend, deadline)
        except RuntimeError as exc:
            pytest.fail(str(exc), pytrace=False)  # the variable is set: a front end that cannot start fails
        yield started
    finally:
        for frontend in started.values():
            frontend.process.terminate()
        for frontend in started.values():
            try:
                frontend.process.wait(10)
            except subprocess.TimeoutExpired:
                frontend.process.kill()
        if sys.exc_info()[0] is None:
            for log in logs.iterdir():
                log.unlink()
            logs.rmdir()
