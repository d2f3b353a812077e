"""TypeSafe's ``assets`` made into ``images`` (app/decisions/assets.py): order, markers, faults."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from app.decisions.assets import MAX_ASSETS, attach, base64_size, plan
from app.errors import ValidationFailed


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_images_follow_the_ones_the_json_had_and_every_reference_is_marked() -> None:
    body: dict[str, Any] = {
        "model": "clef", "images": ["QUJD"],
        "state": {"photo": "front", "notes": ["see front and front-left", {"front": 1}]},
        "questions": {"q": {"type": "choice", "instructions": ["front-left?"],
                            "criteria": {"front": "front-left", "no": None}},
                      "other": "not an object"},
        "assets": {"front": {"type": "image", "part": "a"}, "front-left": {"part": "b"},
                   "inline": {"type": "image", "format": "png", "data_base64": "REVG"}},
        "keep": "front",  # only the state, instructions and criteria hold references
    }
    attach(body, {"a": bytearray(b"1"), "b": bytearray(b"22")})
    assert body["images"] == ["QUJD", b64(b"1"), b64(b"22"), "REVG"]
    assert body["state"] == {"photo": "[img-1]", "notes": ["see [img-1] and [img-2]", {"front": 1}]}
    question = body["questions"]["q"]
    assert question["instructions"] == ["[img-2]?"]
    assert question["criteria"] == {"front": "[img-2]", "no": None}  # option names are not text
    assert body["keep"] == "front" and "assets" not in body


def test_images_that_are_not_a_list_stay_a_400() -> None:
    with pytest.raises(ValidationFailed) as raised:
        attach({"images": "QUJD", "assets": {"r": {"part": "a"}}}, {"a": bytearray(b"1")})
    assert raised.value.problems[0]["loc"] == ["body", "images"]


def test_a_body_without_assets_and_without_files_is_left_alone() -> None:
    body = {"model": "nimble", "state": "s"}
    attach(body, {})
    assert body == {"model": "nimble", "state": "s"}


@pytest.mark.parametrize(("assets", "files", "loc", "says"), [
    ({"r": {"type": "audio", "part": "a"}}, {"a": b"1"}, ["assets", "r", "type"], "only image"),
    ({"r": "a"}, {"a": b"1"}, ["assets", "r"], "must be an object"),
    ({"": {"part": "a"}}, {"a": b"1"}, ["assets", ""], "non-empty string"),
    ({"r": {"type": "image"}}, {}, ["assets", "r", "part"], "needs a 'part'"),
    ({"r": {"part": 3}}, {}, ["assets", "r", "part"], "names part 3"),
    ({"r": {"part": "a"}}, {"a": b""}, ["assets", "r", "part"], "is empty"),
    ({}, {}, ["assets"], "non-empty object"),
])
def test_an_asset_that_does_not_fit_is_a_400_at_its_place(
        assets: Any, files: dict[str, bytes], loc: list[str], says: str) -> None:
    with pytest.raises(ValidationFailed) as raised:
        attach({"state": "s", "assets": assets}, {k: bytearray(v) for k, v in files.items()})
    [problem] = raised.value.problems
    assert problem["loc"] == ["body", *loc] and says in problem["msg"]


def test_references_sharing_long_prefixes_are_replaced_in_one_pass() -> None:
    """A regex alternation of these backtracked over their shared prefix at every position of
    the state (issue #30: 62 KB held the event loop 2.2 s); the automaton reads each character
    once, and the longest reference still wins where two start at one place."""
    references = ["a" * 250 + f"#{i}" for i in range(MAX_ASSETS - 1)] + ["a" * 250]
    state = "a" * 30_000 + "#7" + "b"
    body: dict[str, Any] = {"state": state, "assets": {r: {"data_base64": "QUJD"} for r in references}}
    planned = plan(body, {})
    assert planned is not None
    grown = planned.mark(body)
    # Leftmost first: the 250 a's at the start are the short reference (image 63), and so on,
    # until the last 250 a's before "#7", which are the longest match there: "aaa...#7" (image 7).
    runs, rest = divmod(30_000 - 250, 250)
    assert body["state"] == "[img-63]" * runs + "a" * rest + "[img-7]" + "b"
    assert grown == len(body["state"]) - len(state)


def test_the_plan_weighs_the_images_before_encoding_them() -> None:
    body: dict[str, Any] = {"state": "x", "images": ["QUJD"],
                            "assets": {"r": {"part": "a"}, "s": {"data_base64": "REVG"}}}
    planned = plan(body, {"a": memoryview(b"12345")})
    assert planned is not None and planned.encoded_bytes == base64_size(5) == 8
    assert "images" in body and body["images"] == ["QUJD"]  # nothing encoded yet
    planned.encode(body)
    assert body["images"] == ["QUJD", b64(b"12345"), "REVG"]
