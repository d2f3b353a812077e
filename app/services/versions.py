"""Ollama version gating (SPEC §4): numeric compare; pre-releases, 0.0.0 and junk are too old."""

from __future__ import annotations

import re

DECISION_MIN_OLLAMA = (0, 35, 0)
DECISION_MIN_OLLAMA_TEXT = "0.35.0"
_RELEASE = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)$")


def parse_release(version: str | None) -> tuple[int, int, int] | None:
    """(major, minor, patch) of a plain release; None for pre-releases, builds and junk."""
    if not version:
        return None
    match = _RELEASE.match(version.strip())
    if match is None:
        return None
    parts = tuple(int(p) for p in match.groups())
    if parts == (0, 0, 0):
        return None  # a source build reports 0.0.0
    return parts  # type: ignore[return-value]


def supports_decisions(version: str | None) -> bool:
    release = parse_release(version)
    return release is not None and release >= DECISION_MIN_OLLAMA


def gate_message(version: str | None) -> str:
    return (f"Decision models need Ollama {DECISION_MIN_OLLAMA_TEXT} or newer; "
            f"this Ollama is {version or 'unknown'}.")
