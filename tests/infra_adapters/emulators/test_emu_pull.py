"""The Ollama emulator's `/api/pull`: paced progress, late install, failures."""

from __future__ import annotations

import time
from typing import Any

import httpx
import orjson

from infra_adapters.emulators.ollama import OllamaState
from infra_adapters.emulators.ollama_pull import MANIFEST_ERROR, PROGRESS_STEPS
from infra_adapters.emulators.ollama_state import model_digest, model_size

from .streams import ndjson, timed_lines

DECISION = {"model": "tev1", "state": "s", "questions": {"q": {"type": "noul"}}}


def test_pull_streams_progress_over_pull_seconds_and_installs_at_the_end(
    ollama_client: httpx.Client, ollama: OllamaState
) -> None:
    assert ollama.pull_seconds == 0.3
    seen_while_pulling: list[tuple[bool, bool]] = []
    started = time.monotonic()
    lines: list[tuple[float, dict[str, Any]]] = []
    with ollama_client.stream("POST", "/api/pull", json={"model": "tev1"}) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"] == "application/x-ndjson"
        for raw in resp.iter_lines():
            line = orjson.loads(raw)
            lines.append((time.monotonic() - started, line))
            seen_while_pulling.append(("tev1" in ollama.pulling, ollama.find_model("tev1") is None))
    statuses = [line.get("status") for _, line in lines]
    digest = model_digest("tev1")
    assert statuses[0] == "pulling manifest"
    assert statuses[1:-3] == [f"pulling {digest[:12]}"] * PROGRESS_STEPS
    assert statuses[-3:] == ["verifying sha256 digest", "writing manifest", "success"]
    progress = [line for _, line in lines[1:-3]]
    assert all(p["digest"] == f"sha256:{digest}" for p in progress)
    assert all(p["total"] == model_size("tev1") for p in progress)
    completed = [p["completed"] for p in progress]
    assert completed == sorted(completed) and completed[-1] == model_size("tev1")
    # paced: the lines are spread over pull_seconds, not sent at once
    assert lines[-1][0] - lines[0][0] >= 0.25
    assert lines[10][0] - lines[0][0] >= 0.1
    # installed only at the very end, and no longer "pulling" once the answer is over
    # (checked on the first 15 lines, which arrive >= 6 paces before the install)
    during = seen_while_pulling[:15]
    assert all(pulling and absent for pulling, absent in during), seen_while_pulling
    assert ollama.find_model("tev1:latest") == "tev1"
    assert ollama.pulling == set()
    assert ollama_client.post("/v1/systemone", json=DECISION).status_code == 200
    names = [m["name"] for m in ollama_client.get("/api/tags").json()["models"]]
    assert "tev1:latest" in names


def test_pull_without_stream_answers_once_after_pull_seconds(
    ollama_client: httpx.Client, ollama: OllamaState
) -> None:
    ollama.pull_seconds = 0.2
    started = time.monotonic()
    resp = ollama_client.post("/api/pull", json={"model": "qwen3:0.6b", "stream": False})
    assert time.monotonic() - started >= 0.2
    assert (resp.status_code, resp.json()) == (200, {"status": "success"})
    assert ollama.models["qwen3:0.6b"] == ["completion", "tools", "thinking"]


def test_client_gone_mid_pull_installs_nothing(
    ollama_client: httpx.Client, ollama: OllamaState
) -> None:
    ollama.pull_seconds = 0.3
    with ollama_client.stream("POST", "/api/pull", json={"model": "clef-flash"}) as resp:
        lines = resp.iter_lines()
        assert orjson.loads(next(lines)) == {"status": "pulling manifest"}
        assert orjson.loads(next(lines))["completed"] > 0
        assert ollama.pulling == {"clef-flash"}
    # leaving the block closes the connection mid-stream
    deadline = time.monotonic() + 10.0
    while ollama.pulling and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ollama.pulling == set()
    time.sleep(0.35)  # longer than the whole pull would have taken
    assert ollama.find_model("clef-flash") is None


def test_pull_error_line_stops_the_stream(ollama_client: httpx.Client, ollama: OllamaState) -> None:
    ollama.pull_seconds = 0.05
    ollama.pull_errors["tev1:latest"] = "max retries exceeded: unexpected EOF"
    resp = ollama_client.post("/api/pull", json={"model": "tev1"})
    assert resp.status_code == 200
    lines = ndjson(resp.text)
    assert lines[0] == {"status": "pulling manifest"}
    assert 1 <= sum("completed" in line for line in lines) < PROGRESS_STEPS
    assert lines[-1] == {"error": "max retries exceeded: unexpected EOF"}
    assert not any(line.get("status") == "success" for line in lines)
    assert ollama.find_model("tev1") is None

    quiet = ollama_client.post("/api/pull", json={"model": "tev1", "stream": False})
    assert quiet.status_code == 500
    assert quiet.json() == {"error": "max retries exceeded: unexpected EOF"}
    assert ollama.find_model("tev1") is None and ollama.pulling == set()


def test_unknown_model(ollama_client: httpx.Client, ollama: OllamaState) -> None:
    resp, lines = timed_lines(ollama_client, "/api/pull", {"model": "nope"})
    assert resp.status_code == 200
    assert [orjson.loads(line) for _, line in lines] == [
        {"status": "pulling manifest"},
        {"error": MANIFEST_ERROR},
    ]
    quiet = ollama_client.post("/api/pull", json={"model": "nope", "stream": False})
    assert quiet.status_code == 500
    assert quiet.json() == {"error": "pull model manifest: file does not exist"}
    missing = ollama_client.post("/api/pull", json={})
    assert (missing.status_code, missing.json()) == (400, {"error": "model is required"})
    assert ollama.find_model("nope") is None


def test_pulling_an_installed_model_keeps_it(
    ollama_client: httpx.Client, ollama: OllamaState
) -> None:
    ollama.pull_seconds = 0.0
    ollama.models["nimble"] = ["decision", "custom"]
    lines = ndjson(ollama_client.post("/api/pull", json={"name": "nimble:latest"}).text)
    assert lines[-1] == {"status": "success"}
    assert ollama.models["nimble"] == ["decision", "custom"]
