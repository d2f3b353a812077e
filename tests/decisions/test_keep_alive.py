"""keep_alive (SPEC §1): a number of seconds, or exactly what Go's time.ParseDuration accepts."""

from __future__ import annotations

import orjson
import pytest

from app.decisions.keep_alive import duration_ns, valid

S = 10**9
MS = 10**6
MIN = 60 * S
H = 3600 * S
MAX_NS = 2**63 - 1

GO_ACCEPTS = [
    "5m", "1h30m", "-1m", "0", "+0", "-0", "1.5s", ".5s", "1.s", "300ms", "1us",
    "1\u00b5s",  # micro sign
    "1\u03bcs",  # Greek small letter mu
    "2h45m3.5s", "1h1h", "1ns", "0s", "+5m", "0.5ns", "00h", "1h0m0s",
]

GO_REFUSES = [
    "soon", "-1", "5", "", ".s", "s", "1m1", "1d", "1 m", "9999999999h",
    "-", "+", "--1m", "+-1m", "00", " 5m", "5m ", "5m\n", "5M", "1H", "1.2.3s", "1e3s",
    "5mm", "1,5s", "\u00b5s", "m5", "1sec", "1min", "1hr", "0x10s", "1_000s",
]


@pytest.mark.parametrize("text", GO_ACCEPTS)
def test_accepts_what_go_accepts(text: str) -> None:
    assert duration_ns(text) is not None
    assert valid(text)


@pytest.mark.parametrize("text", GO_REFUSES)
def test_refuses_what_go_refuses(text: str) -> None:
    assert duration_ns(text) is None
    assert not valid(text)


@pytest.mark.parametrize(
    ("text", "nanoseconds"),
    [
        ("0", 0),
        ("+0", 0),
        ("-0", 0),
        ("5m", 5 * MIN),
        ("1h30m", H + 30 * MIN),
        ("-1m", -MIN),
        ("1.5s", 1_500_000_000),
        (".5s", 500_000_000),
        ("1.s", S),
        ("300ms", 300 * MS),
        ("1us", 1_000),
        ("1\u00b5s", 1_000),
        ("1\u03bcs", 1_000),
        ("2h45m3.5s", 2 * H + 45 * MIN + 3_500_000_000),
        ("1h1h", 2 * H),
        ("1ns", 1),
        ("0.5ns", 0),  # Go truncates fractions of the smallest unit
        ("1.0000000001h", H + 360),
        ("-1.5h", -(H + 30 * MIN)),
        ("+5m", 5 * MIN),
    ],
)
def test_nanoseconds(text: str, nanoseconds: int) -> None:
    assert duration_ns(text) == nanoseconds


def test_range_limits_match_go() -> None:
    # Go: a Duration is an int64 of nanoseconds; -2**63 is reachable, +2**63 is not.
    assert duration_ns("2562047h47m16.854775807s") == MAX_NS
    assert duration_ns("9223372036854775807ns") == MAX_NS
    assert duration_ns("-9223372036854775808ns") == -(2**63)
    assert duration_ns("-2562047h47m16.854775808s") == -(2**63)
    assert duration_ns("9223372036854775808ns") is None
    assert duration_ns("2562047h47m16.854775808s") is None
    assert duration_ns("-9223372036854775809ns") is None
    assert duration_ns("2562048h") is None
    assert duration_ns("99999999999999999999999ns") is None


@pytest.mark.parametrize("text", ["\u0661m", "\uff15m", "1\u0660s"])
def test_refuses_non_ascii_digits(text: str) -> None:
    assert duration_ns(text) is None


@pytest.mark.parametrize("value", [0, 5, -1, 300, 1.5, -0.5, 1e30,
                                   orjson.Fragment(b"1.5"), orjson.Fragment("300")])
def test_valid_numbers(value: object) -> None:
    assert valid(value)


def test_null_means_the_backends_default() -> None:
    assert valid(None)


@pytest.mark.parametrize("value", [True, False, [], {}, ["5m"], {"m": 5}, b"5m", "-1", "soon"])
def test_invalid_values(value: object) -> None:
    assert not valid(value)
