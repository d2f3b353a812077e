"""Big bodies (issue #19): a body over its model's text limit in tiny values is refused (413)
before it is decoded; a big body that passes is decoded in a worker thread, off the event loop;
at the limit, the early check never refuses what the full check accepts (SPEC §1)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from app import jsonbody
from app.decisions.offloop import OFF_LOOP_BYTES
from app.errors import TooLarge
from tests.support import Stack, assert_error, decision, wait_for

LIMIT = 65536  # the default text limit (ARBITER_DEFAULT_TEXT_LIMIT)
QUESTIONS = orjson.dumps(decision()["questions"])


def tiny_values(model: str = "nimble", count: int = 400_000, tail: bytes = b"") -> bytes:
    """~1.2 MB of ``{}``: a text of the same size, far over the limit."""
    return (b'{"model":"' + model.encode() + b'","questions":' + QUESTIONS + b',"state":['
            + b",".join([b"{}"] * count) + b"]" + tail + b"}")


def post(stack: Stack, content: bytes, key: str | None = "project", path: str = "/v1/systemone") -> Any:
    with stack.client(key) as client:
        return client.post(path, content=content)


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The names of the threads the full decoder ran on, for each body it decoded."""
    threads: list[str] = []
    loads = jsonbody.loads

    def spy(body: bytes) -> Any:
        threads.append(threading.current_thread().name)
        return loads(body)

    monkeypatch.setattr(jsonbody, "loads", spy)
    yield threads


def test_a_body_over_the_text_limit_in_tiny_values_is_413_undecoded(stack: Stack, decodes: list[str]) -> None:
    error = assert_error(post(stack, tiny_values()), 413, "request_too_large")
    assert f"over the {LIMIT}-byte limit of model 'nimble'" in error["error"]
    assert decodes == []  # the full decoder never saw it


def test_a_refused_body_is_freed_at_once(stack: Stack) -> None:
    """No cycle (the error's traceback -> the route's frame -> the error) keeps the body until a
    full collection, which the app's GC thresholds make rare: 30 MiB a request would pile up."""
    gc.collect()
    gc.disable()
    try:
        assert_error(post(stack, tiny_values()), 413)
        wait_for(lambda: not [o for o in gc.get_objects() if isinstance(o, TooLarge)])
    finally:
        gc.enable()


def test_the_413_comes_before_a_decode_that_would_fail(stack: Stack) -> None:
    """A duplicate key at the very end: decoding would find it (400); the text floor refuses first."""
    body = tiny_values(tail=b',"state":null')
    assert_error(post(stack, body), 413, "request_too_large")


def test_a_big_valid_body_is_decoded_off_the_loop(stack: Stack, decodes: list[str]) -> None:
    image = "QUJD" * (300 * 1024)  # 1.2 MB of base64: media, not text
    response = post(stack, orjson.dumps(decision("clef", images=[image])))
    assert response.status_code == 200, response.text
    assert len(decodes) == 1 and decodes[0].startswith("arbiter-body")
    assert stack.ollama_state.requests[-1].json["images"] == [image]
    small = post(stack, orjson.dumps(decision()))  # the hot path stays on the loop
    assert small.status_code == 200 and not decodes[1].startswith("arbiter-body")


def _at_text(size: int) -> bytes:
    """A body whose text (compact, media aside) is ``size`` bytes, written with enough
    whitespace to be over the off-loop threshold."""
    body = decision(state="")
    body["state"] = "x" * (size - len(jsonbody.dumps(body)))
    raw = jsonbody.dumps(body)
    assert len(raw) == size
    return raw[:-1] + b" " * OFF_LOOP_BYTES + b"}"


def test_at_the_limit_the_early_check_refuses_nothing_the_full_check_accepts(
        stack: Stack, decodes: list[str]) -> None:
    def forwarded() -> int:
        return sum(r.path == "/v1/systemone" for r in stack.ollama_state.requests)

    before = forwarded()
    post(stack, _at_text(LIMIT))  # the emulator answers it (it counts "nimble:latest": its own 413)
    assert forwarded() == before + 1  # Arbiter let it through
    error = assert_error(post(stack, _at_text(LIMIT + 1)), 413, "request_too_large")
    assert f"is {LIMIT + 1} bytes, over the {LIMIT}-byte limit of model" in error["error"]  # the full check's count
    assert forwarded() == before + 1 and len(decodes) == 2


def test_a_big_body_for_a_model_that_is_no_use_is_refused_undecoded(stack: Stack, decodes: list[str]) -> None:
    """No service here takes that much text: the request's own refusal comes without decoding."""
    narrow = stack.new_project("narrow", models=["clef"])
    assert_error(post(stack, tiny_values(), key=narrow), 403, "permission_error")
    assert_error(post(stack, tiny_values("ghost")), 404, "not_found_error")
    missing = b'{"state":[' + b",".join([b"{}"] * 400_000) + b"]}"
    assert assert_error(post(stack, missing), 400)["detail"][0]["loc"] == ["body", "model"]
    assert decodes == []


def test_a_big_body_that_is_not_json_is_400(stack: Stack) -> None:
    """Unless its text is over the limit: a body over it is refused before anything else in it is
    looked at (a 413 for the truncated body of 30 MiB of ``{}``, a 400 once it is small)."""
    truncated = b'{"model":"nimble","state":[' + b" " * OFF_LOOP_BYTES + b"{}, {}"
    assert_error(post(stack, truncated), 400, "invalid_request_error")
    assert_error(post(stack, tiny_values()[:-1]), 413, "request_too_large")
    assert_error(post(stack, b"[" + b",".join([b"{}"] * 400_000) + b"]"), 400, "invalid_request_error")


def test_the_openai_route_refuses_it_too(stack: Stack, decodes: list[str]) -> None:
    body = (b'{"model":"nimble","questions":[],"input":[' + b",".join([b"{}"] * 400_000) + b"]}")
    response = post(stack, body, path="/v1/decisions")
    assert response.status_code == 413 and response.json()["error"]["type"] == "request_too_large"
    assert decodes == []
