"""Every fault knob, observed from a client (with timeouts, so nothing hangs)."""

from __future__ import annotations

import time
from typing import Any

import httpx
import orjson
import pytest

from infra_adapters.emulators.faults import Faults
from infra_adapters.emulators.ollama import OllamaState
from infra_adapters.emulators.vllm import VllmState

SMALL = {"model": "nimble", "state": "s", "questions": {"q": {"type": "noul"}}}


def _post(client: httpx.Client, body: Any = SMALL, **kw: Any) -> httpx.Response:
    return client.post("/v1/systemone", json=body, **kw)


def test_latency(ollama_client: httpx.Client, ollama: OllamaState) -> None:
    ollama.faults.latency = 0.3
    started = time.monotonic()
    assert _post(ollama_client).status_code == 200
    assert time.monotonic() - started >= 0.3
    with pytest.raises(httpx.ReadTimeout):
        _post(ollama_client, timeout=0.1)


def test_status(ollama_client: httpx.Client, ollama: OllamaState) -> None:
    ollama.faults.status = 503
    ollama.faults.body = b'{"error":"server busy"}'
    ollama.faults.headers = {"Retry-After": "2"}
    resp = _post(ollama_client)
    assert resp.status_code == 503
    assert resp.content == b'{"error":"server busy"}'
    assert resp.headers["content-type"] == "application/json; charset=utf-8"
    assert resp.headers["retry-after"] == "2"
    ollama.faults.status, ollama.faults.body = 500, b"boom"
    ollama.faults.content_type = "text/plain"
    resp = _post(ollama_client)
    assert (resp.status_code, resp.content, resp.headers["content-type"]) == (
        500,
        b"boom",
        "text/plain",
    )


def test_drop_connection(ollama_client: httpx.Client, ollama: OllamaState) -> None:
    ollama.faults.drop_connection = True
    with pytest.raises(httpx.RemoteProtocolError):
        _post(ollama_client, timeout=2.0)


def test_non_json(ollama_client: httpx.Client, ollama: OllamaState) -> None:
    ollama.faults.non_json = True
    resp = _post(ollama_client)
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/html")
    assert resp.content == b"<html>oops</html>"


def test_hang(ollama_client: httpx.Client, ollama: OllamaState) -> None:
    ollama.faults.hang = True
    started = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        _post(ollama_client, timeout=0.3)
    assert time.monotonic() - started < 2.0
    # other endpoints keep working
    assert ollama_client.get("/api/version").status_code == 200


def test_reset_mid_body(ollama_client: httpx.Client, ollama: OllamaState) -> None:
    ollama.faults.reset_mid_body = True
    with ollama_client.stream("POST", "/v1/systemone", json=SMALL, timeout=2.0) as resp:
        assert resp.status_code == 200
        with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
            resp.read()


def test_huge_body(ollama_client: httpx.Client, ollama: OllamaState) -> None:
    size = 3 * 1024 * 1024 + 7
    ollama.faults.huge_body_bytes = size
    resp = _post(ollama_client)
    assert resp.status_code == 200
    assert int(resp.headers["content-length"]) == size
    assert len(resp.content) == size
    assert isinstance(orjson.loads(resp.content), dict)


def test_trickle(ollama_client: httpx.Client, ollama: OllamaState) -> None:
    expected = _post(ollama_client).content
    ollama.faults.trickle_delay = 0.003
    started = time.monotonic()
    chunks = 0
    # a per-read timeout shorter than the whole answer: trickling defeats it
    with ollama_client.stream(
        "POST", "/v1/systemone", json=SMALL, timeout=httpx.Timeout(0.5)
    ) as resp:
        received = b""
        for chunk in resp.iter_raw():
            chunks += 1
            received += chunk
    assert received == expected
    assert chunks > 5
    assert time.monotonic() - started >= 0.003 * (len(expected) - 1)


def test_reset_restores_normal_answers(ollama_client: httpx.Client, ollama: OllamaState) -> None:
    f = ollama.faults
    f.latency, f.status, f.non_json, f.hang = 0.5, 500, True, True
    f.drop_connection, f.reset_mid_body, f.huge_body_bytes, f.trickle_delay = True, True, 9, 1.0
    f.headers["X-A"] = "1"
    assert f.active
    f.reset()
    assert not f.active
    assert f == Faults(applied=f.applied)
    assert _post(ollama_client).status_code == 200


def test_faults_apply_to_the_decision_endpoint_only(
    ollama_client: httpx.Client, ollama: OllamaState
) -> None:
    ollama.faults.status = 500
    assert ollama_client.get("/api/tags").status_code == 200
    assert _post(ollama_client).status_code == 500


@pytest.mark.parametrize("knob", ["status", "non_json", "drop_connection", "hang"])
def test_vllm_applies_the_same_knobs(vllm_client: httpx.Client, vllm: VllmState, knob: str) -> None:
    body = {"model": "Qwen/Qwen3-0.6B", "state": "s", "questions": {"q": {"type": "noul"}}}
    if knob == "status":
        vllm.faults.status = 502
        assert _post(vllm_client, body).status_code == 502
    elif knob == "non_json":
        vllm.faults.non_json = True
        assert _post(vllm_client, body).content == b"<html>oops</html>"
    elif knob == "drop_connection":
        vllm.faults.drop_connection = True
        with pytest.raises(httpx.RemoteProtocolError):
            _post(vllm_client, body, timeout=2.0)
    else:
        vllm.faults.hang = True
        with pytest.raises(httpx.ReadTimeout):
            _post(vllm_client, body, timeout=0.2)
    vllm.faults.reset()
    assert _post(vllm_client, body).status_code == 200
