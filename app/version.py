"""Arbiter's own version, as installed."""

from __future__ import annotations

from importlib import metadata

try:
    VERSION = metadata.version("arbiter")
except metadata.PackageNotFoundError:  # pragma: no cover - running from a tree that is not installed
    VERSION = "0.0.0+unknown"
