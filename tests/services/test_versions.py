"""Ollama version gating (SPEC §4)."""

from __future__ import annotations

import pytest

from app.services.versions import gate_message, parse_version, supports_decisions


@pytest.mark.parametrize(
    "version",
    ["0.35.0", "0.35.1", "0.36.0", "0.40.4", "1.0.0", "2.0.0", "0.100.0", "10.0.0",
     "v0.35.0", " 0.35.0 ", "0.35.0\n",
     "0.36.0-rc1", "0.35.1-rc0", "1.0.0-beta.2",  # pre-releases of newer versions
     "0.35.0+build", "0.35.0+g1234abc", "0.36.0-rc1+build.5"],  # build metadata is not a pre-release
)
def test_new_enough(version: str) -> None:
    assert supports_decisions(version)


@pytest.mark.parametrize(
    "version",
    [
        "0.34.9", "0.34.99", "0.6.5", "0.9.0", "0.3.50", "0.0.1",
        "0.35.0-rc1", "0.35.0-rc0", "0.35.0-alpha", "0.35.0-rc1+build",  # pre-releases of 0.35.0
        "0.34.9-rc1", "0.34.9+build",
        "0.0.0", "v0.0.0", "0.0.0-rc1", "0.0.0+dev",
        None, "", "   ", "junk", "unknown", "0.35", "0.35.0.1", "1", "latest", "0.35.x",
        "V0.35.0", "vv0.35.0", ".35.0", "0..35",
        "0.35.0-", "0.35.0+", "0.35.0-rc 1", "0.35.0_rc1",
    ],
)
def test_too_old(version: str | None) -> None:
    assert not supports_decisions(version)


def test_compares_numerically_not_as_text() -> None:
    assert parse_version("0.6.5") == ((0, 6, 5), False)
    assert parse_version("0.35.0") == ((0, 35, 0), False)
    assert supports_decisions("0.35.0") and not supports_decisions("0.6.5")


@pytest.mark.parametrize(
    ("version", "parsed"),
    [("v1.2.3", ((1, 2, 3), False)), ("0.35.0", ((0, 35, 0), False)), ("0.35.0-rc1", ((0, 35, 0), True)),
     ("0.36.0-rc1+b7", ((0, 36, 0), True)), ("0.35.0+build", ((0, 35, 0), False)), ("0.0.0", None),
     (None, None), ("", None), ("1.2", None), ("12.34.56", ((12, 34, 56), False))],
)
def test_parse_version(version: str | None, parsed: tuple[tuple[int, int, int], bool] | None) -> None:
    assert parse_version(version) == parsed


def test_gate_message_exact_text() -> None:
    assert gate_message("0.34.9") == "Decision models need Ollama 0.35.0 or newer; this Ollama is 0.34.9."
    assert gate_message("0.35.0-rc1") == (
        "Decision models need Ollama 0.35.0 or newer; this Ollama is 0.35.0-rc1.")
    assert gate_message("0.0.0") == "Decision models need Ollama 0.35.0 or newer; this Ollama is 0.0.0."


def test_gate_message_without_a_version() -> None:
    message = gate_message(None)
    assert message.startswith("Decision models need Ollama 0.35.0 or newer; this Ollama is ")
    assert message.endswith(".") and "None" not in message
