"""Ollama version gating (SPEC §4): numeric compare; a pre-release of 0.35.0, 0.0.0 and junk are too old."""

from __future__ import annotations

import re

DECISION_MIN_OLLAMA = (0, 35, 0)
DECISION_MIN_OLLAMA_TEXT = "0.35.0"
# X.Y.Z, then an optional pre-release (-rc1) and build (+build), as semantic versioning writes them.
_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$")


def parse_version(version: str | None) -> tuple[tuple[int, int, int], bool] | None:
    """((major, minor, patch), whether it is a pre-release); None for junk and source builds (0.0.0)."""
    if not version:
        return None
    match = _VERSION.match(version.strip())
    if match is None:
        return None
    release = (int(match[1]), int(match[2]), int(match[3]))
    if release == (0, 0, 0):
        return None  # a source build reports 0.0.0
    return release, match[4] is not None


def supports_decisions(version: str | None) -> bool:
    """0.35.0 or newer. A pre-release is older than its own release only: 0.35.0-rc1 is too old,
    0.35.1-rc0 and 0.36.0-rc1 are new enough; build metadata (+...) changes nothing."""
    parsed = parse_version(version)
    if parsed is None:
        return False
    release, pre_release = parsed
    return release > DECISION_MIN_OLLAMA or (release == DECISION_MIN_OLLAMA and not pre_release)


def gate_message(version: str | None) -> str:
    return (f"Decision models need Ollama {DECISION_MIN_OLLAMA_TEXT} or newer; "
            f"this Ollama is {version or 'unknown'}.")
