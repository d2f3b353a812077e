"""Imports point one way: the contracts of ``[tool.importlinter]`` in pyproject.toml hold.

CI runs ``lint-imports`` too (.ci/run); here the suite says so where a developer runs it, and shows
that the contract does catch an upward import (a copy of the tree with one added).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = str(Path(sys.executable).with_name("lint-imports"))


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LINT_IMPORTS, "--no-cache"], cwd=root, capture_output=True, text=True,
                          timeout=120, check=False)


def test_the_import_contracts_are_kept() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "infra_adapters never imports app" in result.stdout
    assert "the data plane (app.routing) imports nothing above it" in result.stdout
    assert " 0 broken." in result.stdout


def test_an_import_of_the_admin_side_from_the_data_plane_breaks_the_contract(tmp_path: Path) -> None:
    for name in ("app", "infra_adapters"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    router = tmp_path / "app" / "routing" / "router.py"
    router.write_text(router.read_text() + "\nfrom app.services import sync  # noqa: E402\n")

    result = lint_imports(tmp_path)

    assert result.returncode != 0
    assert "app.routing is not allowed to import app.services" in result.stdout
    assert "app.routing.router -> app.services.sync" in result.stdout
