"""Ollama version gating (SPEC §4)."""

from __future__ import annotations

import pytest

from app.services.versions import gate_message, parse_release, supports_decisions


@pytest.mark.parametrize(
    "version",
    ["0.35.0", "0.35.1", "0.36.0", "0.40.4", "1.0.0", "2.0.0", "0.100.0", "10.0.0",
     "v0.35.0", " 0.35.0 ", "0.35.0\n"],
)
def test_new_enough(version: str) -> None:
    assert supports_decisions(version)


@pytest.mark.parametrize(
    "version",
    [
        "0.34.9", "0.34.99", "0.6.5", "0.9.0", "0.3.50", "0.0.1",
        "0.35.0-rc1", "0.35.0-rc0", "0.35.0-alpha", "0.36.0-rc1",  # pre-releases, even newer ones
        "0.0.0", "v0.0.0",
        None, "", "   ", "junk", "unknown", "0.35", "0.35.0.1", "1", "latest", "0.35.x",
        "V0.35.0", "vv0.35.0", "0.35.0+build", ".35.0", "0..35",
    ],
)
def test_too_old(version: str | None) -> None:
    assert not supports_decisions(version)


def test_compares_numerically_not_as_text() -> None:
    assert parse_release("0.6.5") == (0, 6, 5)
    assert parse_release("0.35.0") == (0, 35, 0)
    assert parse_release("0.6.5") < parse_release("0.35.0")  # type: ignore[operator]
    assert supports_decisions("0.35.0") and not supports_decisions("0.6.5")


@pytest.mark.parametrize(
    ("version", "release"),
    [("v1.2.3", (1, 2, 3)), ("0.35.0", (0, 35, 0)), ("0.35.0-rc1", None), ("0.0.0", None),
     (None, None), ("", None), ("1.2", None), ("12.34.56", (12, 34, 56))],
)
def test_parse_release(version: str | None, release: tuple[int, int, int] | None) -> None:
    assert parse_release(version) == release


def test_gate_message_exact_text() -> None:
    assert gate_message("0.34.9") == "Decision models need Ollama 0.35.0 or newer; this Ollama is 0.34.9."
    assert gate_message("0.35.0-rc1") == (
        "Decision models need Ollama 0.35.0 or newer; this Ollama is 0.35.0-rc1.")
    assert gate_message("0.0.0") == "Decision models need Ollama 0.35.0 or newer; this Ollama is 0.0.0."


def test_gate_message_without_a_version() -> None:
    message = gate_message(None)
    assert message.startswith("Decision models need Ollama 0.35.0 or newer; this Ollama is ")
    assert message.endswith(".") and "None" not in message
