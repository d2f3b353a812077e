"""POST /v1/systemone with multipart/form-data bodies (SPEC §1, TypeSafe's SDK format): the parts
become a JSON request with base64 ``images``; every bad part is a 400 that names it."""

from __future__ import annotations

import base64
import gzip
import threading
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest
import zstandard

from app.decisions import assets, multipart
from app.decisions.offloop import OFF_LOOP_BYTES
from tests.support import Gateway, Stack, assert_error, decision, synced

BOUNDARY = "5f0c1d2e3a4b5c6d7e8f90a1b2c3d4e5"
IMAGE = b"\x89PNG\r\n\x1a\n\r\n--5f0c1d2e\r\n" + bytes(range(256))
REF = "<image:0123456789abcdef0123456789abcdef>"


def part(name: str, content: bytes, content_type: str = "application/octet-stream",
         filename: str | None = None, disposition: str | None = None) -> bytes:
    disposition = disposition or f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
    return (f"--{BOUNDARY}\r\nContent-Disposition: {disposition}\r\nContent-Type: {content_type}\r\n\r\n"
            .encode() + content + b"\r\n")


def form(*parts: bytes) -> bytes:
    return b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()


def request_part(body: Any) -> bytes:
    return part("request", orjson.dumps(body), "application/json")


def with_image(model: str = "clef", **extra: Any) -> dict[str, Any]:
    return decision(model, state=f"Photo: {REF}",
                    assets={REF: {"type": "image", "part": "asset-0"}}, **extra)


def post(stack: Stack, content: bytes, content_type: str = f"multipart/form-data; boundary={BOUNDARY}",
         path: str = "/v1/systemone", **headers: str) -> Any:
    with stack.client() as client:
        return client.post(path, content=content, headers={"Content-Type": content_type, **headers})


def forwarded(stack: Stack) -> list[Any]:
    return [r for r in stack.ollama_state.requests if r.path == "/v1/systemone"]


def test_the_parts_become_a_json_request_with_base64_images(stack: Stack) -> None:
    response = post(stack, form(request_part(with_image()), part("asset-0", IMAGE, "image/png", "asset-0")))
    assert response.status_code == 200, response.text
    [sent] = forwarded(stack)
    assert sent.header("content-type", "").startswith("application/json")
    assert sent.json["images"] == [base64.b64encode(IMAGE).decode()]
    assert sent.json["state"] == "Photo: [img-0]" and "assets" not in sent.json
    assert list(sent.json["questions"]) == ["team", "urgent", "tone"]


@pytest.mark.parametrize("encoding", ["gzip", "zstd"])
def test_an_encoded_multipart_body_is_decoded_first(stack: Stack, encoding: str) -> None:
    raw = form(request_part(with_image()), part("asset-0", IMAGE, "image/png", "asset-0"))
    packed = gzip.compress(raw) if encoding == "gzip" else zstandard.ZstdCompressor().compress(raw)
    response = post(stack, packed, **{"Content-Encoding": encoding})
    assert response.status_code == 200, response.text
    assert forwarded(stack)[0].json["images"] == [base64.b64encode(IMAGE).decode()]


def test_the_same_checks_as_a_json_body(stack: Stack) -> None:
    """An image for a model without vision: the capability check's 400, as for JSON."""
    error = assert_error(post(stack, form(request_part(with_image("nimble")),
                                          part("asset-0", IMAGE, filename="asset-0"))), 400)
    assert "vision" in error["error"]
    narrow = stack.new_project("narrow", models=["nimble"])
    with stack.client(narrow) as client:
        refused = client.post("/v1/systemone", content=form(request_part(decision("clef"))),
                              headers={"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"})
    assert_error(refused, 403, "permission_error")
    assert not forwarded(stack)


def _bad_bodies() -> dict[str, tuple[bytes, str, str]]:
    """Name -> (body, Content-Type, what the 400's message says)."""
    ctype = f"multipart/form-data; boundary={BOUNDARY}"
    image = part("asset-0", IMAGE, "image/png", "asset-0")
    whole = form(request_part(with_image()), image)
    return {
        "no request part": (form(image), ctype, "no part named 'request'"),
        "the request part is not JSON": (form(part("request", b"{not json"), image), ctype, "not valid JSON"),
        "an asset names a part the body lacks": (form(request_part(with_image())), ctype,
                                                 f"assets.{REF}.part: names part 'asset-0', which"),
        "a part no asset names": (form(request_part(decision("clef")), image), ctype,
                                  "part 'asset-0' of the multipart body is not named by any entry"),
        "two assets for one part": (form(request_part(decision("clef", assets={REF: {"part": "asset-0"},
                                                                               "b": {"part": "asset-0"}})),
                                         image), ctype, "named by two assets"),
        "a part twice": (form(request_part(decision()), request_part(decision())), ctype,
                         "two parts named 'request'"),
        "assets not an object": (form(request_part(decision(assets=[REF]))), ctype,
                                 "assets: must be a non-empty object"),
        "a part without a name": (form(part("x", b"1", disposition="form-data")), ctype,
                                  "no 'Content-Disposition: form-data; name=...'"),
        "no boundary": (whole, "multipart/form-data", "has no boundary"),
        "another boundary": (whole, "multipart/form-data; boundary=other", "malformed"),
        "truncated": (whole[:-40], ctype, "ends before its closing boundary"),
        "not form-data": (whole, f"multipart/mixed; boundary={BOUNDARY}", "multipart/mixed is not accepted"),
        "a header too long": (form(part("request", b"{}", "x" * 5000)), ctype, "malformed"),
    }


BAD = _bad_bodies()


@pytest.mark.parametrize("name", BAD)
def test_a_bad_part_is_a_400_that_names_it(stack: Stack, name: str) -> None:
    content, content_type, says = BAD[name]
    error = assert_error(post(stack, content, content_type), 400)
    assert isinstance(error["detail"], list)
    assert says in error["error"], error["error"]
    assert not forwarded(stack)


def test_a_multipart_body_over_the_cap_is_413(stack: Stack, gateway_factory: Callable[..., Gateway]) -> None:
    stack.gateway = synced(gateway_factory(max_body_bytes=4096))
    raw = form(request_part(with_image()), part("asset-0", IMAGE * 40, "image/png", "asset-0"))
    assert_error(post(stack, raw), 413, "request_too_large")
    bomb = zstandard.ZstdCompressor().compress(form(request_part(with_image()), part("asset-0", bytes(1 << 20))))
    assert_error(post(stack, bomb, **{"Content-Encoding": "zstd"}), 413, "request_too_large")


def test_the_openai_route_takes_no_multipart_body(stack: Stack) -> None:
    response = post(stack, form(request_part(decision())), path="/v1/decisions")
    assert response.status_code == 400
    assert "multipart bodies are accepted on /v1/systemone only" in response.json()["error"]["message"]


@pytest.fixture
def threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The threads the parts were read and the images encoded on."""
    seen: list[str] = []
    for module, name in ((multipart, "read_form"), (assets.Plan, "encode")):
        original = getattr(module, name)

        def spy(*args: Any, _original: Any = original) -> Any:
            seen.append(threading.current_thread().name)
            return _original(*args)

        monkeypatch.setattr(module, name, spy)
    yield seen


def test_a_big_multipart_body_is_read_off_the_loop(stack: Stack, threads: list[str]) -> None:
    big = IMAGE * (2 * OFF_LOOP_BYTES // len(IMAGE))
    response = post(stack, form(request_part(with_image()), part("asset-0", big, "image/png", "asset-0")))
    assert response.status_code == 200, response.text
    assert len(threads) == 2 and all(t.startswith("arbiter-body") for t in threads), threads
    assert forwarded(stack)[0].json["images"] == [base64.b64encode(big).decode()]
    small = post(stack, form(request_part(with_image()), part("asset-0", IMAGE, "image/png", "asset-0")))
    assert small.status_code == 200 and not any(t.startswith("arbiter-body") for t in threads[2:])
