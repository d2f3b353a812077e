"""The docs stay true: every setting and every CLI command is documented."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.cli import _parser
from app.settings import Settings

DOCS = Path(__file__).resolve().parents[1] / "docs"


@pytest.mark.parametrize("name", sorted(Settings.model_fields))
def test_every_setting_is_documented(name: str) -> None:
    assert f"`ARBITER_{name.upper()}`" in (DOCS / "configuration.md").read_text()


def test_every_documented_setting_exists() -> None:
    import re

    documented = set(re.findall(r"`ARBITER_([A-Z_]+)`", (DOCS / "configuration.md").read_text()))
    assert documented == {name.upper() for name in Settings.model_fields}


def test_every_cli_command_is_documented() -> None:
    admin = (DOCS / "cli.md").read_text()
    parser = _parser()
    subparsers = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, sub in subparsers.choices.items():
        nested = [a for a in sub._actions if a.__class__.__name__ == "_SubParsersAction"]
        commands = [f"arbiter {name} {child}" for child in nested[0].choices] if nested else [f"arbiter {name}"]
        for command in commands:
            assert command in admin, f"{command!r} is not in docs/cli.md"


def test_every_cli_option_is_documented() -> None:
    """Every long option of every command, the remote mode's included, is named in docs/cli.md."""
    import argparse

    cli = (DOCS / "cli.md").read_text()

    def options(parser: argparse.ArgumentParser) -> set[str]:
        found = {f for a in parser._actions for f in a.option_strings if f.startswith("--") and f != "--help"}
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    found |= options(child)
        return found

    missing = sorted(o for o in options(_parser()) if not any(f"{c}{o}" in cli for c in "`[ "))
    assert missing == [], f"not in docs/cli.md: {missing}"


def test_no_file_keeps_a_merge_conflict() -> None:
    """Code fails to import with conflict markers in it; a document does not, so look."""
    root = DOCS.parent
    markers = ("<<<<<<< ", ">>>>>>> ")
    paths = [*root.glob("*.md"), *DOCS.rglob("*.md"), *(root / "bench").glob("*.md"),
             *(root / "deploy").rglob("*"), *(root / "app").rglob("*.html")]
    kept = [str(p.relative_to(root)) for p in paths if p.is_file()
            and any(line.startswith(markers) for line in p.read_text(errors="replace").splitlines())]
    assert kept == []
