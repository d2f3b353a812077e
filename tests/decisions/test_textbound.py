"""textbound: the text floor counted on a body's bytes never exceeds the text the full check
measures (SPEC §1: the body without its media fields, as compact JSON), and is close to it for
bodies of tiny values."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app import jsonbody
from app.decisions import schema, textbound
from app.decisions.schema import MEDIA_FIELDS
from app.errors import ValidationFailed


def text_of(raw: bytes) -> int:
    """The text as the full check measures it (app/decisions/forward.py)."""
    body = jsonbody.loads(raw)
    return len(jsonbody.dumps({k: v for k, v in body.items() if k not in MEDIA_FIELDS}))


def floor(raw: bytes) -> int:
    return textbound.text_floor(raw, textbound.probe(raw))


def encodings(value: Any) -> list[bytes]:
    """The same value as clients write it: compact, spaced, indented, ASCII-escaped, ``\\/``."""
    compact = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return [compact.encode(), json.dumps(value).encode(), json.dumps(value, indent=3).encode(),
            json.dumps(value, ensure_ascii=True).encode(), compact.replace("/", "\\/").encode()]


leaves = (st.none() | st.booleans() | st.integers(-(10**30), 10**30) | st.floats(allow_nan=False, allow_infinity=False)
          | st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12))
values = st.recursive(leaves, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                                          max_size=4), max_leaves=20)
media = st.lists(st.text(alphabet="ABCabc0123+/=:,{}[]\"\\ ", min_size=1, max_size=20), max_size=3)


# A media field whose value is not a list of strings counts (a 400 once decoded): only the media
# members drawn as media are media here.
@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=6).filter(lambda key: key not in MEDIA_FIELDS), values, max_size=5),
       st.dictionaries(st.sampled_from(sorted(MEDIA_FIELDS)), media | st.none()))
def test_the_floor_never_exceeds_the_text(members: dict[str, Any], media_members: dict[str, Any]) -> None:
    for raw in encodings({**members, **media_members, "model": "nimble"}):
        assert floor(raw) <= text_of(raw)
        plain = textbound.plain_floor(raw, over=1 << 40)
        assert plain is None or plain <= text_of(raw)


# Numbers as clients write them (``1E+5``, ``-0``, ``2.50``): kept as their text, never re-encoded.
numbers = st.from_regex(r"-?(0|[1-9][0-9]{0,24})(\.[0-9]{1,6})?([eE][+-]?[0-9]{1,3})?", fullmatch=True).map(
    lambda text: orjson.Fragment(text.encode()))
structured = st.recursive(st.none() | st.booleans() | st.floats(allow_nan=False, allow_infinity=False) | numbers
                          | st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12),
                          lambda inner: (st.lists(inner, max_size=4)
                                         | st.dictionaries(st.text(max_size=6), inner, max_size=4)),
                          max_leaves=16)
options = st.dictionaries(st.text(min_size=1, max_size=6), structured, min_size=1, max_size=4)
questions = st.one_of(
    st.fixed_dictionaries({"type": st.just("choice"), "criteria": options}, optional={"instructions": structured}),
    st.fixed_dictionaries({"type": st.just("noul")}, optional={
        "instructions": structured,
        "criteria": st.fixed_dictionaries({}, optional={"true": structured, "false": structured})}),
    st.fixed_dictionaries({"type": st.just("score"),
                           "criteria": st.lists(structured.filter(lambda v: v is not None), min_size=2, max_size=10)},
                          optional={"instructions": structured}),
)

valid_media = st.lists(st.sampled_from(["QUJD", "data:image/png;base64,QUJD", "QU\\/J+"]), max_size=3)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=6), questions, min_size=1, max_size=4), structured,
       st.dictionaries(st.sampled_from(sorted(MEDIA_FIELDS)), valid_media))
def test_the_floor_never_exceeds_the_text_of_structured_instructions_and_descriptions(
        asked: dict[str, Any], state: Any, media_members: dict[str, Any]) -> None:
    """Instructions and descriptions of any JSON kind (SPEC §1) count as the state counts."""
    body = {"model": "nimble", "state": state, "questions": asked, **media_members}
    for raw in (orjson.dumps(body), orjson.dumps(body, option=orjson.OPT_INDENT_2),
                orjson.dumps(body).replace(b"/", b"\\/")):
        parsed = jsonbody.loads(raw)
        if not isinstance(state, (bool, int, float, orjson.Fragment)):
            schema.validate(parsed)  # a request the full check accepts
        assert floor(raw) <= text_of(raw)
        plain = textbound.plain_floor(raw, over=1 << 40)
        assert plain is None or plain <= text_of(raw)


@pytest.mark.parametrize("raw", [
    rb'{"model":"m","state":"\u0041\u00e9\u20ac\ud83d\ude00 \\u0041 \\\\u0041"}',
    rb'{"model":"m","state":[-0,-0.0,1e5,-1E-5,123456789012345678901234567890]}',
    rb'{"model":"m","state":"' + b"\\\\" * 1000 + rb'"}',
    rb'{"model":"m","state":"' + b"\\u0041" * 1000 + rb'"}',
    rb'{"model":"m","state":"' + b"abcdef0123 " * 1000 + rb'"}',
    rb'{"model":"m","images":null,"audio":["QUJD","data:audio/wav;base64,QUJD"],"state":null}',
    b'{"model":"m","state":"' + "é€😀".encode() * 1000 + b'"}',
])
def test_the_floor_never_exceeds_the_text_on_escapes_numbers_and_media(raw: bytes) -> None:
    assert 0 <= floor(raw) <= text_of(raw)


def test_an_escape_split_across_chunks_is_not_counted_twice() -> None:
    raw = b'{"model":"m","state":"' + b"x" * (textbound.CHUNK - 23) + b"\\u0041" * 3 + b'"}'
    assert raw[textbound.CHUNK - 1:textbound.CHUNK + 1] == b"\\u"
    assert floor(raw) <= text_of(raw)


def test_tiny_values_are_counted_in_full() -> None:
    raw = b'{"model":"nimble","state":[' + b",".join([b"{}"] * 100_000) + b"]}"
    assert text_of(raw) - 20 <= floor(raw) <= text_of(raw)


def test_counting_stops_once_past_the_limit_it_is_held_to() -> None:
    raw = b'{"model":"nimble","state":[' + b",".join([b"{}"] * 1_000_000) + b"]}"
    probe = textbound.probe(raw)
    assert probe.can_exceed(65536)
    early = textbound.text_floor(raw, probe, over=65536)
    assert 65536 < early <= textbound.CHUNK < floor(raw) <= text_of(raw)


def test_a_body_of_images_and_a_short_state_is_not_counted() -> None:
    raw = json.dumps({"model": "clef", "state": "x", "images": ["QUJD" * 100_000]}).encode()
    assert not textbound.probe(raw).can_exceed(65536)


def test_media_do_not_count_but_a_media_field_that_is_not_a_list_of_strings_does() -> None:
    image = "QUJD" * 50_000
    with_image = json.dumps({"model": "clef", "state": "x", "images": [image]}).encode()
    assert floor(with_image) <= text_of(with_image) < 100
    wrong = b'{"model":"clef","state":"x","images":[' + b",".join([b"{}"] * 50_000) + b"]}"
    assert floor(wrong) > 100_000  # a 400 once decoded; its structure counts here


def test_the_model_is_read_without_decoding_the_rest() -> None:
    assert textbound.probe(b'{"state":[],"model":"nimble"}').model == "nimble"
    missing = textbound.probe(b'{"state":[]}')
    assert missing.model is None and missing.model_missing
    for raw in (b'{"model":""}', b'{"model":5}', b'{"model":["x"]}'):
        probe = textbound.probe(raw)
        assert probe.model is None and not probe.model_missing
        assert probe.model_problem().problems[0]["type"] == "string_type"


@pytest.mark.parametrize(("raw", "kind"), [
    (b'[{}, {}]', "model_attributes_type"),
    (b'{"model": "m", "state": [{}, {}', "json_invalid"),
    (b'{"model": NaN}', "json_invalid"),
    (b'{"s":' + b"[" * 5000 + b"]" * 5000 + b"}", "json_invalid"),
])
def test_what_is_not_a_json_object_is_400(raw: bytes, kind: str) -> None:
    with pytest.raises(ValidationFailed) as caught:
        textbound.probe(raw)
    assert caught.value.status == 400 and caught.value.problems[0]["type"] == kind


def test_a_body_that_names_its_model_first_needs_no_probe() -> None:
    raw = b' {\n "model" : "nimble", "state": []}'
    assert textbound.leading(raw) == textbound.Probe("nimble", False, 0, len(raw))
    for raw in (b'{"state": [], "model": "nimble"}', b'{"model": "nim\\u0062le"}', b'{"model": ""}',
                b'{"model": 5}', b'{"model": "' + b"m" * 300 + b'"}'):
        assert textbound.leading(raw) is None


def test_the_plain_count_gives_up_where_media_could_be() -> None:
    state = b",".join([b"{}"] * 200_000)
    late_image = b'{"model":"clef","state":[' + state + b'],"images":["QUJD"]}'
    assert textbound.plain_floor(late_image, over=1 << 40) is None  # it has to know where the image is
    assert 65536 < (textbound.plain_floor(late_image, over=65536) or 0) <= text_of(late_image)  # past it first
    escaped = b'{"model":"clef","state":"\\u0041","im\\u0061ges":["QUJD"]}'
    assert textbound.plain_floor(escaped, over=1 << 40) is None
    plain = b'{"model":"clef","state":[' + state + b"]}"
    assert textbound.plain_floor(plain, over=1 << 40) == floor(plain)


def test_a_media_list_of_millions_of_items_counts_as_text_undecoded() -> None:
    """A list of more items than a media field takes is no media list: its bytes count as text (the
    body is then refused on its floor), never decoded into millions of strings to find out."""
    body = b'{"model":"nimble","state":"s","images":[' + b",".join([b'"A"'] * 1_000_000) + b"]}"
    probed = textbound.probe(body)
    assert probed.media_bytes == 0 and probed.can_exceed(65536)
    few = b'{"model":"nimble","state":"s","images":["data:image/png;base64,AAAA","QUJD"]}'
    assert textbound.probe(few).media_bytes > 0
