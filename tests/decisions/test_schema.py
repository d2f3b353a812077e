"""schema.validate(): the field rules of SPEC §1, checked in place on the parsed body."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from app.decisions.schema import MAX_MEDIA_ITEMS, MEDIA_FIELDS, DecisionRequest, validate
from app.errors import ValidationFailed
from app.jsonbody import dumps, loads
from infra_adapters.media import MEDIA_FIELDS as ADAPTER_MEDIA_FIELDS
from tests.support import decision


def one(question: dict[str, Any]) -> dict[str, Any]:
    return decision(questions={"q": question})


def problems(value: Any) -> list[dict[str, Any]]:
    with pytest.raises(ValidationFailed) as caught:
        validate(value)
    assert caught.value.status == 400
    return caught.value.problems


def locs(value: Any) -> list[list[Any]]:
    return [p["loc"] for p in problems(value)]


def test_spec_example_is_valid() -> None:
    result = validate(decision(images=["iVBORw0KGgo="], keep_alive="5m"))
    assert result == DecisionRequest(model="nimble", media=("images",), remote_media=False)


@pytest.mark.parametrize("value", [None, [], "x", 1, True, [{"model": "x"}]])
def test_body_must_be_an_object(value: Any) -> None:
    assert locs(value) == [["body"]]


# --- model --------------------------------------------------------------------


@pytest.mark.parametrize("model", ["", None, 1, ["nimble"], {"name": "nimble"}, True])
def test_model_must_be_a_non_empty_string(model: Any) -> None:
    assert locs(decision(model=model)) == [["body", "model"]]


def test_model_required() -> None:
    value = decision()
    del value["model"]
    [problem] = problems(value)
    assert problem["loc"] == ["body", "model"] and problem["type"] == "missing"


# --- state --------------------------------------------------------------------


@pytest.mark.parametrize("state", ["text", "", {}, {"a": 1}, [], [1, "x"], None])
def test_state_content_ok(state: Any) -> None:
    assert validate(decision(state=state)).model == "nimble"


@pytest.mark.parametrize("state", [0, 1, -1.5, True, False, orjson.Fragment(b"1.5")])
def test_state_number_or_boolean_refused(state: Any) -> None:
    assert locs(decision(state=state)) == [["body", "state"]]


def test_state_key_required() -> None:
    value = decision()
    del value["state"]
    [problem] = problems(value)
    assert problem["loc"] == ["body", "state"] and problem["type"] == "missing"


# --- questions ----------------------------------------------------------------


def test_questions_required() -> None:
    value = decision()
    del value["questions"]
    assert locs(value) == [["body", "questions"]]


@pytest.mark.parametrize("questions", [None, [], [{"type": "noul"}], "q", 1])
def test_questions_must_be_an_object(questions: Any) -> None:
    assert locs(decision(questions=questions)) == [["body", "questions"]]


@pytest.mark.parametrize("count", [1, 64])
def test_question_count_ok(count: int) -> None:
    validate(decision(questions={f"q{i}": {"type": "noul"} for i in range(count)}))


@pytest.mark.parametrize("count", [0, 65])
def test_question_count_out_of_bounds(count: int) -> None:
    [problem] = problems(decision(questions={f"q{i}": {"type": "noul"} for i in range(count)}))
    assert problem["loc"] == ["body", "questions"]
    assert problem["type"] == ("too_short" if count == 0 else "too_long")


def test_question_id_must_be_non_empty() -> None:
    assert locs(decision(questions={"": {"type": "noul"}})) == [["body", "questions", ""]]


@pytest.mark.parametrize("question", [None, "noul", ["noul"], 1])
def test_question_must_be_an_object(question: Any) -> None:
    assert locs(decision(questions={"q": question})) == [["body", "questions", "q"]]


def test_question_type_required() -> None:
    [problem] = problems(one({"instructions": "x"}))
    assert problem["loc"] == ["body", "questions", "q", "type"] and problem["type"] == "missing"


@pytest.mark.parametrize("qtype", ["Choice", "boolean", "", None, 1, "yesno", ["choice"]])
def test_unknown_question_type(qtype: Any) -> None:
    [problem] = problems(one({"type": qtype, "criteria": {"a": None}}))
    assert problem["loc"] == ["body", "questions", "q", "type"]
    assert problem["type"] == "literal_error"


# Any JSON value (SPEC §1: "the same content as state", and more): the backend decides.
STRUCTURED = ["x", "", {"a": [1]}, {}, [], ["x", 1], None, 1, 0, 0.5, True, False, orjson.Fragment(b"1.0"),
              [{"role": "user"}, {"nested": {"deep": [None, 2.5e10]}}]]


@pytest.mark.parametrize("instructions", STRUCTURED)
def test_instructions_take_any_json_value(instructions: Any) -> None:
    for qtype, criteria in (("noul", None), ("choice", {"a": None}), ("score", ["low", "high"])):
        validate(one({"type": qtype, "instructions": instructions, "criteria": criteria}))


def test_instructions_never_added() -> None:
    value = one({"type": "noul"})
    validate(value)
    assert value["questions"]["q"] == {"type": "noul"}


# --- choice -------------------------------------------------------------------


@pytest.mark.parametrize("count", [1, 255])
def test_choice_option_count_ok(count: int) -> None:
    validate(one({"type": "choice", "criteria": {f"o{i}": None for i in range(count)}}))


@pytest.mark.parametrize("count", [0, 256])
def test_choice_option_count_out_of_bounds(count: int) -> None:
    [problem] = problems(one({"type": "choice", "criteria": {f"o{i}": "x" for i in range(count)}}))
    assert problem["loc"] == ["body", "questions", "q", "criteria"]
    assert problem["type"] == ("too_short" if count == 0 else "too_long")


@pytest.mark.parametrize("criteria", [None, ["a", "b"], "a", 1])
def test_choice_needs_object_criteria(criteria: Any) -> None:
    assert locs(one({"type": "choice", "criteria": criteria})) == [
        ["body", "questions", "q", "criteria"]]


def test_choice_without_criteria() -> None:
    [problem] = problems(one({"type": "choice"}))
    assert problem["loc"] == ["body", "questions", "q", "criteria"] and problem["type"] == "missing"


def test_choice_descriptions_take_any_json_value() -> None:
    value = one({"type": "choice", "criteria": {f"o{i}": text for i, text in enumerate(STRUCTURED)}})
    before = dumps(value)
    validate(value)
    assert dumps(value) == before  # checked in place, nothing rewritten


# --- noul ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "question",
    [
        {"type": "noul"},
        {"type": "noul", "criteria": None},
        {"type": "noul", "criteria": {}},
        {"type": "noul", "criteria": {"true": "yes"}},
        {"type": "noul", "criteria": {"false": "no"}},
        {"type": "noul", "criteria": {"true": "yes", "false": "no"}},
    ],
)
def test_noul_criteria_ok(question: dict[str, Any]) -> None:
    validate(one(question))


@pytest.mark.parametrize(
    ("criteria", "bad"),
    [
        ({"yes": "x"}, ["yes"]),
        ({"True": "x"}, ["True"]),
        ({"true": "x", "maybe": "y"}, ["maybe"]),
        ({"1": "x", "0": "y"}, ["1", "0"]),
    ],
)
def test_noul_criteria_other_keys_refused(criteria: dict[str, Any], bad: list[str]) -> None:
    found = problems(one({"type": "noul", "criteria": criteria}))
    assert [p["loc"] for p in found] == [["body", "questions", "q", "criteria", key] for key in bad]
    assert {p["type"] for p in found} == {"extra_forbidden"}


@pytest.mark.parametrize("criteria", [["true"], "yes", 1, True])
def test_noul_criteria_must_be_null_or_object(criteria: Any) -> None:
    assert locs(one({"type": "noul", "criteria": criteria})) == [["body", "questions", "q", "criteria"]]


@pytest.mark.parametrize("text", STRUCTURED)
def test_noul_descriptions_take_any_json_value(text: Any) -> None:
    validate(one({"type": "noul", "criteria": {"true": text, "false": text}}))


# --- score --------------------------------------------------------------------


@pytest.mark.parametrize("count", [2, 10])
def test_score_level_count_ok(count: int) -> None:
    validate(one({"type": "score", "criteria": [f"level {i}" for i in range(count)]}))


@pytest.mark.parametrize("count", [0, 1, 11])
def test_score_level_count_out_of_bounds(count: int) -> None:
    [problem] = problems(one({"type": "score", "criteria": [f"level {i}" for i in range(count)]}))
    assert problem["loc"] == ["body", "questions", "q", "criteria"]
    assert problem["type"] == ("too_long" if count == 11 else "too_short")


@pytest.mark.parametrize("criteria", [None, {"0": "low", "1": "high"}, "low,high", 3])
def test_score_needs_a_list(criteria: Any) -> None:
    assert locs(one({"type": "score", "criteria": criteria})) == [["body", "questions", "q", "criteria"]]


def test_score_levels_take_any_json_value_but_null() -> None:
    levels = [level for level in STRUCTURED if level is not None]
    for start in range(0, len(levels), 5):
        validate(one({"type": "score", "criteria": levels[start:start + 5] + ["last"]}))
    found = problems(one({"type": "score", "criteria": ["low", None, {"level": 2}, None]}))
    assert [p["loc"] for p in found] == [["body", "questions", "q", "criteria", 1],
                                         ["body", "questions", "q", "criteria", 3]]
    assert {p["type"] for p in found} == {"none_forbidden"}


# --- keep_alive ---------------------------------------------------------------


@pytest.mark.parametrize("keep_alive", ["5m", "1h30m", "-1m", "0", 0, 300, -1, 1.5,
                                        orjson.Fragment(b"2.5")])
def test_keep_alive_ok(keep_alive: Any) -> None:
    validate(decision(keep_alive=keep_alive))


@pytest.mark.parametrize("keep_alive", ["soon", "-1", "5", "", True, [], {}])
def test_keep_alive_refused(keep_alive: Any) -> None:
    [problem] = problems(decision(keep_alive=keep_alive))
    assert problem["loc"] == ["body", "keep_alive"] and problem["type"] == "duration_parsing"


# --- media --------------------------------------------------------------------


PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAAB"


def test_no_media() -> None:
    result = validate(decision())
    assert result.media == () and result.remote_media is False


def test_the_media_fields_are_the_ones_the_backends_and_read_strategies_know() -> None:
    """The adapters reshape, and the read strategies refuse, the same media fields the schema checks."""
    assert tuple(MEDIA_FIELDS) == ADAPTER_MEDIA_FIELDS


def test_media_present_and_non_empty() -> None:
    result = validate(decision(images=[PNG], audio=[], videos=None))
    assert result.media == ("images",) and result.remote_media is False
    result = validate(decision(videos=["data:video/mp4;base64,AAAA"], audio=["UklGRg=="], images=[PNG]))
    assert result.media == ("images", "audio", "videos")


@pytest.mark.parametrize("url", ["http://example.com/a.png", "https://example.com/a.png", " http://169.254.169.254/",
                                 "\x00\t" * 20 + "HTTPS://169.254.169.254/"])
def test_remote_media_flagged(url: str) -> None:
    result = validate(decision(images=[PNG, url]))
    assert result.media == ("images",) and result.remote_media is True


def test_media_problems_located() -> None:
    found = problems(decision(images="iVBOR", audio=[PNG, "", 3, "ftp://x/y.wav", "file:///etc/passwd"]))
    assert [(p["loc"], p["type"]) for p in found] == [
        (["body", "images"], "list_type"),
        (["body", "audio", 1], "string_type"),
        (["body", "audio", 2], "string_type"),
        (["body", "audio", 3], "url_scheme"),
        (["body", "audio", 4], "url_scheme"),
    ]


# --- problems together, untouched body -------------------------------------------


def test_every_problem_reported_together() -> None:
    value = {
        "model": "",
        "state": 5,
        "questions": {
            "team": {"type": "choice", "criteria": {}},
            "urgent": {"type": "noul", "criteria": {"maybe": "x"}},
            "tone": {"type": "score", "criteria": ["only one"]},
            "odd": {"type": "ranking"},
        },
        "keep_alive": "soon",
        "images": [7],
    }
    with pytest.raises(ValidationFailed) as caught:
        validate(value)
    error = caught.value
    assert [p["loc"] for p in error.problems] == [
        ["body", "model"],
        ["body", "state"],
        ["body", "questions", "team", "criteria"],
        ["body", "questions", "urgent", "criteria", "maybe"],
        ["body", "questions", "tone", "criteria"],
        ["body", "questions", "odd", "type"],
        ["body", "keep_alive"],
        ["body", "images", 0],
    ]
    assert all(set(p) == {"loc", "msg", "type"} and p["msg"] for p in error.problems)
    assert error.detail() == error.problems
    assert error.message.startswith("model: ")
    assert error.error_type == "invalid_request_error"


def test_missing_fields_reported_together() -> None:
    assert locs({}) == [["body", "model"], ["body", "state"], ["body", "questions"]]
    assert problems({})[0]["type"] == "missing"


def test_error_names_the_first_problem_by_path() -> None:
    with pytest.raises(ValidationFailed) as caught:
        validate(one({"type": "score", "criteria": ["x"]}))
    assert caught.value.message.startswith("questions.q.criteria: ")


def test_unknown_fields_untouched_and_body_not_mutated() -> None:
    raw = (
        b'{"options":{"temperature":0.10,"seed":123456789012345678901234567890},'
        b'"model":"nimble","cache_salt":"abc","state":null,'
        b'"questions":{"z":{"type":"noul","weight":1.50,"extra":{"k":[1,2]}},'
        b'"a":{"type":"choice","criteria":{"y":null,"x":"ex"},"labels":"AB"},'
        b'"m":{"type":"score","criteria":["lo","hi"],"logprobs":true}},'
        b'"keep_alive":-1,"images":["' + PNG.encode() + b'"],"stream":false,"truncate":1e400}'
    )
    value = loads(raw)
    before_ids = {key: id(item) for key, item in value.items()}
    result = validate(value)
    assert dumps(value) == raw  # same keys, same order, same exact numbers
    assert {key: id(item) for key, item in value.items()} == before_ids
    assert list(value["questions"]) == ["z", "a", "m"]
    assert result == DecisionRequest(model="nimble", media=("images",), remote_media=False)


def test_invalid_body_not_mutated_either() -> None:
    raw = b'{"model":"nimble","state":1,"questions":{"q":{"type":"noul","criteria":{"x":1}}},"x":1}'
    value = loads(raw)
    with pytest.raises(ValidationFailed):
        validate(value)
    assert dumps(value) == raw


def test_remote_urls_are_recognised_whatever_their_case() -> None:
    from app.decisions.schema import validate

    body = {"model": "m", "state": None, "questions": {"q": {"type": "noul"}},
            "images": ["HTTPS://example.com/a.png", "Data:image/png;base64,AAAA"]}
    assert validate(body).remote_media is True


def test_a_media_field_holds_at_most_64_items() -> None:
    """Each item is checked (and, for vLLM, wrapped in a data: URL): millions of tiny ones cost seconds
    and hundreds of MB from a body of a few KB of zstd (issue #30's review)."""
    assert validate(decision(images=[PNG] * MAX_MEDIA_ITEMS)).media == ("images",)
    with pytest.raises(ValidationFailed) as refused:
        validate(decision(images=["A"] * 8_000_000, audio=["UklGRg=="] * (MAX_MEDIA_ITEMS + 1)))
    problems = {tuple(p["loc"]): p["msg"] for p in refused.value.problems}
    assert problems == {("body", "images"): "has 8000000 items; at most 64 are accepted",
                        ("body", "audio"): "has 65 items; at most 64 are accepted"}
