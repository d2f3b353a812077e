"""jsonbody: strict one-shot parsing (SPEC §1) and exact-number dumps."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app import jsonbody
from app.errors import InvalidRequest, ValidationFailed
from app.jsonbody import dumps, is_number, loads, number_value


def refused(body: bytes) -> ValidationFailed:
    with pytest.raises(ValidationFailed) as caught:
        loads(body)
    error = caught.value
    assert isinstance(error, InvalidRequest) and error.status == 400
    assert error.problems[0]["loc"] == ["body"]
    assert error.problems[0]["type"] == "json_invalid"
    return error


# --- refusals ----------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b'{"a": 1, "a": 2}',
        b'{"a": 1, "a": 1}',
        b'{"model": "x", "questions": {"q": {"type": "noul"}}, "model": "y"}',
        b'{"a": {"b": 1, "b": 2}}',
        b'{"q": {"x": {"type": "choice", "type": "noul"}}}',
        b'[{"x": 1}, {"y": 1, "y": null}]',
        b'{"a": 1, "\\u0061": 2}',  # the same key, spelt with an escape
    ],
)
def test_duplicate_keys_refused(body: bytes) -> None:
    assert "duplicate key" in refused(body).message


def test_same_key_in_sibling_objects_is_fine() -> None:
    assert loads(b'{"a": {"k": 1}, "b": {"k": 2}}') == {"a": {"k": 1}, "b": {"k": 2}}


@pytest.mark.parametrize(
    "body",
    [b'{"a": NaN}', b'{"a": Infinity}', b'{"a": -Infinity}', b"NaN", b"[1, Infinity]",
     b'{"a": nan}', b'{"a": inf}'],
)
def test_nan_and_infinity_refused(body: bytes) -> None:
    refused(body)


@pytest.mark.parametrize(
    "body",
    [
        b'{"a": "\xff"}',
        b'{"a": "\xc3"}',  # truncated two-byte sequence
        b'{"a": "\xc0\xaf"}',  # overlong encoding
        b'{"a": "\xed\xa0\x80"}',  # an encoded surrogate
        b'{"\xfe": 1}',
    ],
)
def test_invalid_utf8_refused(body: bytes) -> None:
    assert "UTF-8" in refused(body).message


def test_bom_refused() -> None:
    refused(b'\xef\xbb\xbf{"model": "x"}')


@pytest.mark.parametrize("body", [b"", b" ", b"{", b'{"a": 1} x', b"{'a': 1}", b'{"a": 1,}',
                                  b"[1, 2", b'{"a" 1}', b"undefined", b'{"a": 01}'])
def test_not_json_refused(body: bytes) -> None:
    refused(body)


@pytest.mark.parametrize("depth", [5_000, 100_000, 1_000_000])
def test_deep_nesting_refused_cleanly(depth: int) -> None:
    refused(b"[" * depth + b"]" * depth)
    refused(b'{"a":' * depth + b"1" + b"}" * depth)


def test_what_parses_but_cannot_be_written_back_is_refused() -> None:
    # Deep enough that orjson's encoder gives up, shallow enough for the standard library's
    # decoder; and lone surrogates, which it decodes into strings that are not UTF-8. A body that
    # loads() gives must never fail later, when it is forwarded.
    for body in (b"[" * 400 + b"]" * 400, b'{"a": "x\\ud800y"}', b'{"\\udc00": 1}',
                 b'{"a": "' + b"x" * jsonbody.FAST_MAX_BYTES + b'\\udfff"}'):
        assert "cannot be re-encoded" in refused(body).message
    with pytest.raises(ValidationFailed):
        dumps(["\ud800"])


def test_escaped_surrogate_pair_is_one_character() -> None:
    assert dumps(loads(b'{"a":"\\ud83d\\ude00"}')) == '{"a":"\U0001f600"}'.encode()


# --- exact numbers -----------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        b"1.10", b"1e400", b"-1e400", b"-0.0", b"0.0", b"1E-7", b"2.50e+3", b"1e5", b"0.1",
        b"3.141592653589793238462643383279", b"123456789012345678901234567890",
        b"-123456789012345678901234567890", b"18446744073709551616", b"-9223372036854775809",
        b"1" + b"0" * 4000,
    ],
)
def test_numbers_round_trip_with_their_exact_text(text: bytes) -> None:
    assert dumps(loads(text)) == text
    body = b'{"state":{"n":' + text + b',"list":[' + text + b"," + text + b"]}}"
    assert dumps(loads(body)) == body


@pytest.mark.parametrize("n", [0, 1, -1, 42, 2**53 + 1, 2**63 - 1, -(2**63), 2**64 - 1])
def test_64_bit_integers_stay_ints(n: int) -> None:
    value = loads(str(n).encode())
    assert type(value) is int and value == n
    assert dumps(value) == str(n).encode()


def test_floats_and_big_ints_are_fragments() -> None:
    assert isinstance(loads(b"1.10"), orjson.Fragment)
    assert isinstance(loads(b"123456789012345678901234567890"), orjson.Fragment)
    assert isinstance(loads(b"-0.0"), orjson.Fragment)


@pytest.mark.parametrize("digits", [4301, 10_000])
def test_huge_integers_round_trip_or_400(digits: int) -> None:
    text = b"9" * digits
    for body in (text, b'{"a":' + text + b"}"):
        try:
            value = loads(body)
        except ValidationFailed:
            continue
        assert dumps(value) == body


# --- structure and text ------------------------------------------------------


def test_key_order_preserved() -> None:
    body = b'{"z":1,"a":2,"m":{"q9":{},"q1":{},"q5":{}},"b":[{"y":1,"x":2}]}'
    value = loads(body)
    assert list(value) == ["z", "a", "m", "b"]
    assert list(value["m"]) == ["q9", "q1", "q5"]
    assert list(value["b"][0]) == ["y", "x"]
    assert dumps(value) == body


def test_non_ascii_kept_unescaped() -> None:
    text = "za\u017c\u00f3\u0142\u0107 \u65e5\u672c \U0001f600"
    assert dumps({"a": text}) == ('{"a":"' + text + '"}').encode("utf-8")
    assert b"\\u" not in dumps(loads(b'{"a":"\\u017c\\u65e5"}'))
    assert dumps(loads(b'{"a":"\\u017c"}')) == '{"a":"\u017c"}'.encode()


def test_dumps_is_compact() -> None:
    assert dumps(loads(b'{ "a" : [ 1 , 2 ] ,\n "b" : null }')) == b'{"a":[1,2],"b":null}'


def test_loads_plain_values() -> None:
    assert loads(b'{"a": "x", "b": true, "c": null, "d": [1, "2"]}') == {
        "a": "x", "b": True, "c": None, "d": [1, "2"]}
    assert loads(b'"just a string"') == "just a string"


# --- is_number / number_value ---------------------------------------------------


@pytest.mark.parametrize("value", [0, 1, -5, 2**70, 1.5, float("inf"), orjson.Fragment(b"1.10"),
                                   orjson.Fragment("2e3")])
def test_is_number(value: object) -> None:
    assert is_number(value)


@pytest.mark.parametrize("value", [True, False, None, "1", b"1", [1], {"a": 1}])
def test_is_not_number(value: object) -> None:
    assert not is_number(value)


def test_number_value_of_plain_numbers() -> None:
    assert number_value(3) == 3.0 and isinstance(number_value(3), float)
    assert number_value(-7) == -7.0
    assert number_value(2.5) == 2.5
    assert number_value(loads(b"42")) == 42.0


@pytest.mark.parametrize(
    ("fragment", "expected"),
    [
        (orjson.Fragment(b"1.10"), 1.1),
        (orjson.Fragment("2e3"), 2000.0),
        (loads(b"-0.0"), 0.0),
        (loads(b"1e400"), float("inf")),
        (loads(b"123456789012345678901234567890"), 1.2345678901234568e29),
    ],
)
def test_number_value_of_fragments(fragment: orjson.Fragment, expected: float) -> None:
    assert number_value(fragment) == expected


# --- the fast parser and the strict one agree ---------------------------------------------


def _strict_result(body: bytes) -> tuple[str, object]:
    try:
        return "value", dumps(jsonbody._strict(body))
    except ValidationFailed as error:
        return "error", error.message


def _result(body: bytes) -> tuple[str, object]:
    try:
        return "value", dumps(loads(body))
    except ValidationFailed as error:
        return "error", error.message


@pytest.mark.parametrize(
    "body",
    [
        b'{"a": 1, "b": "\\u003a"}',  # an escaped colon in a value, no duplicate
        b'{"a": 1, "a": "\\u003a"}',  # a duplicate whose value is an escaped colon
        b'{"a": 1, "a": "\\u003A"}',
        b'{"a:b": 1, "a:b": 2}',  # colons inside the duplicated key
        b'{"a": "x:y", "a": "z"}',
        b'{"a": {"b": 1, "c": {"d": 1, "d": 2}}}',
        b'{"\\\\u003a": 1}',  # an escaped backslash then "u003a": no colon at all
        b'{"a":"\\\\u003a","a":1}',
        b'{"k": 1, "\\u006b": 2}',
        b'[' * 300 + b']' * 300,  # past orjson's nesting limit, within the standard library's
    ],
)
def test_escapes_and_colons_cannot_hide_a_duplicate(body: bytes) -> None:
    assert _result(body) == _strict_result(body)


def test_the_benchmark_body_parses_the_same_both_ways() -> None:
    from bench.run import request_body

    body = request_body("nimble")
    assert loads(body) == jsonbody._strict(body)
    assert dumps(loads(body)) == body


_keys = st.sampled_from(["a", "b", "model", "a:b", ":", "é", "\\", '"', "k"])
_scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
            | st.sampled_from(["1.50", "1e5", "-0.0", "2E-3", "1e400"]).map(orjson.Fragment)
            | st.text(alphabet=st.sampled_from('ab:é\\"\n\u2028x'), max_size=6))


def _encode(value: object, ascii_only: bool, spaced: bool, escape_colons: bool = False) -> str:
    """JSON text of ``value``, where a list of (key, value) pairs is an object (keys may repeat);
    ``escape_colons`` writes every colon inside a string as \\u003a."""
    sep, colon = (", ", ": ") if spaced else (",", ":")

    def string(text: str) -> str:
        encoded = json.dumps(text, ensure_ascii=ascii_only)
        return encoded.replace(":", "\\u003a") if escape_colons else encoded

    def encode(item: object) -> str:
        if isinstance(item, tuple):  # an object, as its pairs
            return "{" + sep.join(string(k) + colon + encode(v) for k, v in item) + "}"
        if isinstance(item, list):
            return "[" + sep.join(encode(v) for v in item) + "]"
        if isinstance(item, orjson.Fragment):
            return orjson.dumps(item).decode()
        return string(item) if isinstance(item, str) else json.dumps(item)

    return encode(value)


_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.lists(st.tuples(_keys, inner), max_size=4).map(tuple),
    max_leaves=20,
)


@given(value=_values, ascii_only=st.booleans(), spaced=st.booleans(), escape_colons=st.booleans())
@settings(max_examples=400, deadline=None)
def test_the_fast_parser_agrees_with_the_strict_one(value: object, ascii_only: bool, spaced: bool,
                                                    escape_colons: bool) -> None:
    body = _encode(value, ascii_only, spaced, escape_colons).encode()
    assert _result(body) == _strict_result(body)


def test_large_bodies_skip_the_fast_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past FAST_MAX_BYTES the strict parser alone reads a body: msgspec would turn each integer of
    thousands of digits into an int first (quadratic), where the strict parser keeps the text."""

    class Refuses:
        def decode(self, body: bytes) -> object:
            raise AssertionError("the fast parser read a large body")

    monkeypatch.setattr(jsonbody, "_fast", Refuses())
    body = b"[" + b",".join([b"7" * 4300] * 8) + b"]"
    assert len(body) > jsonbody.FAST_MAX_BYTES
    assert dumps(loads(body)) == body
