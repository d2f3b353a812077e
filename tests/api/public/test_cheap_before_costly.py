"""Cheap before costly (issue #30): every check that needs no parsing runs before any work that
grows with the body, and a body is held to the caps after every expansion (decompressed, then
multipart-decoded, then base64-encoded), within one decode budget for the process."""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest
import zstandard
from sqlalchemy import update

from app import jsonbody
from app.db.models import Project
from app.decisions import assets, multipart
from app.decisions.budget import MiB
from tests.api.public.test_systemone_multipart import BOUNDARY, IMAGE, REF, form, part, request_part, with_image
from tests.support import Gateway, Stack, assert_error, decision, synced, wait_for

CTYPE = f"multipart/form-data; boundary={BOUNDARY}"


def post(stack: Stack, content: bytes, key: str | None = None, **headers: str) -> Any:
    with stack.client(key or "project") as client:
        return client.post("/v1/systemone", content=content, headers={"Content-Type": CTYPE, **headers})


def forwarded(stack: Stack) -> list[Any]:
    return [r for r in stack.ollama_state.requests if r.path == "/v1/systemone"]


@pytest.fixture
def work(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The costly steps a request reached: its parts read, references marked, images encoded."""
    seen: list[str] = []
    for owner, name in ((multipart, "read_form"), (assets.Plan, "mark"), (assets.Plan, "encode")):
        original = getattr(owner, name)

        def spy(*args: Any, _original: Any = original, _name: str = name) -> Any:
            seen.append(_name)
            return _original(*args)

        monkeypatch.setattr(owner, name, spy)
    yield seen


def image_form(model: str = "clef", image: bytes = IMAGE) -> bytes:
    return form(request_part(with_image(model)), part("asset-0", image, "image/png", "asset-0"))


def test_a_spent_rate_limit_is_429_before_the_body_is_read(stack: Stack, work: list[str]) -> None:
    with stack.client("admin") as admin:
        assert admin.patch("/admin/projects/acme", json={"requests_per_minute": 1}).status_code == 200
    assert post(stack, image_form()).status_code == 200
    work.clear()
    refused = post(stack, image_form())
    assert_error(refused, 429, "rate_limit_error")
    assert refused.headers["connection"] == "close" and "retry-after" in refused.headers
    assert work == []  # not even its parts were read


def test_an_archived_project_is_403_before_the_body_is_read(stack: Stack, work: list[str]) -> None:
    with stack.db.session() as session:
        session.execute(update(Project).values(archived=True))
    stack.gateway.app.components.keys.invalidate()
    refused = post(stack, image_form())
    assert "archived" in assert_error(refused, 403, "permission_error")["error"]
    assert refused.headers["connection"] == "close"
    assert work == []
    # SPEC §1's order holds among the head's checks: the encoding (415) before the archive (403).
    assert_error(post(stack, image_form(), **{"Content-Encoding": "br"}), 415)


def test_a_forbidden_or_unknown_model_is_refused_before_any_image_work(stack: Stack, work: list[str]) -> None:
    narrow = stack.new_project("narrow", models=["nimble"])
    assert_error(post(stack, image_form("clef"), key=narrow), 403, "permission_error")
    assert_error(post(stack, image_form("ghost")), 404, "not_found_error")
    assert "mark" not in work and "encode" not in work
    assert not forwarded(stack)


def test_a_bad_request_part_is_400_before_any_image_work(stack: Stack, work: list[str]) -> None:
    bad = form(request_part(with_image(questions={})), part("asset-0", IMAGE, "image/png", "asset-0"))
    assert_error(post(stack, bad), 400, "invalid_request_error")
    assert "mark" not in work and "encode" not in work


def test_images_whose_base64_passes_the_body_cap_are_413_and_never_forwarded(
        stack: Stack, gateway_factory: Callable[..., Gateway], work: list[str]) -> None:
    stack.gateway = synced(gateway_factory(max_body_bytes=120_000))
    image = IMAGE * (100_000 // len(IMAGE))  # ~100 KB on the wire, ~133 KB as base64
    body = image_form(image=image)
    assert len(body) < 120_000
    error = assert_error(post(stack, body), 413, "request_too_large")
    assert "as base64" in error["error"] and "ARBITER_MAX_BODY_BYTES" in error["error"]
    assert "encode" not in work and not forwarded(stack)
    small = image_form(image=IMAGE * (60_000 // len(IMAGE)))  # 80 KB as base64: forwarded under the cap
    assert post(stack, small).status_code == 200
    [sent] = forwarded(stack)
    assert len(orjson.dumps(sent.json)) <= 120_000


def test_a_compressed_image_form_is_held_to_the_cap_after_each_expansion(stack: Stack, work: list[str]) -> None:
    # 1 KB on the wire, a 31 MiB part once decompressed: under the 32 MiB body cap, not as base64.
    bomb = zstandard.ZstdCompressor().compress(image_form(image=bytes(31 * MiB)))
    assert len(bomb) < 4096
    error = assert_error(post(stack, bomb, **{"Content-Encoding": "zstd"}), 413, "request_too_large")
    assert "as base64" in error["error"]
    assert "encode" not in work and not forwarded(stack)
    budget = stack.gateway.app.decisions.budget
    wait_for(lambda: budget.used == 0)  # given back once the answer has gone


def test_the_decode_budget_refuses_a_growing_body_while_others_hold_it(
        stack: Stack, gateway_factory: Callable[..., Gateway]) -> None:
    stack.gateway = synced(gateway_factory(decode_budget_bytes=4 * MiB))
    budget = stack.gateway.app.decisions.budget
    other = budget.reservation()
    other.take(3 * MiB)  # another request's body, being decoded
    body = zstandard.ZstdCompressor().compress(orjson.dumps(decision(state="x" * (3 * MiB))))
    with stack.client() as client:
        refused = client.post("/v1/systemone", content=body, headers={"Content-Encoding": "zstd",
                                                                     "Content-Type": "application/json"})
        error = assert_error(refused, 503, "backend_error")
        assert "ARBITER_DECODE_BUDGET_BYTES" in error["error"] and refused.headers["retry-after"] == "1"
        wait_for(lambda: budget.used == 3 * MiB)  # what it had taken was given back
        other.release()
        alone = client.post("/v1/systemone", content=body, headers={"Content-Encoding": "zstd",
                                                                   "Content-Type": "application/json"})
    assert_error(alone, 413, "request_too_large")  # decoded, then refused for its text: not the budget's
    wait_for(lambda: budget.used == 0)


def test_a_big_body_for_an_unusable_model_is_held_to_the_smallest_text_limit(
        stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    with stack.client("admin") as admin:
        added = admin.post("/admin/services", json={"type": "ollama-external", "url": stack.ollama.url,
                                                    "name": "roomy", "text_limit": 1 << 20})
        assert added.status_code in (200, 201), added.text
    decoded: list[int] = []
    original = jsonbody.loads

    def loads(raw: bytes) -> Any:
        decoded.append(len(raw))
        return original(raw)

    monkeypatch.setattr(jsonbody, "loads", loads)
    big = orjson.dumps(decision("ghost", state="x" * 200_000))  # under the roomy service's limit
    with stack.client() as client:
        assert_error(client.post("/v1/systemone", content=big, headers={"Content-Type": "application/json"}),
                     404, "not_found_error")
    assert decoded == []  # refused on its text floor: the smallest limit here is 64 KiB


def test_asset_references_are_capped_in_number_and_length(stack: Stack) -> None:
    many = {f"<image:{i}>": {"type": "image", "data_base64": base64.b64encode(IMAGE).decode()}
            for i in range(assets.MAX_ASSETS + 1)}
    too_many = form(request_part(decision("clef", state="s", assets=many)))
    assert "at most 64" in assert_error(post(stack, too_many), 400)["error"]
    long_ref = "a" * 1000 + "#i"
    too_long = form(request_part(decision("clef", state=long_ref, assets={long_ref: {"part": "asset-0"}})),
                    part("asset-0", IMAGE, "image/png", "asset-0"))
    assert "at most 256 characters" in assert_error(post(stack, too_long), 400)["error"]
    assert not forwarded(stack)
    assert REF  # the SDK's own references are well within both
