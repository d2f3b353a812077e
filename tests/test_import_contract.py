"""Imports point one way: the contracts of ``[tool.importlinter]`` in pyproject.toml hold.

CI runs ``lint-imports`` too (.ci/run); here the suite says so where a developer runs it, and shows
that the contract does catch an upward import (a copy of the tree with one added).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

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


def package_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The cycles among the packages and top-level modules of the graph (``app.decisions``,
    ``app.errors``, ``infra_adapters.emulators``...): sets of them of which each reaches every other
    through direct imports (the strongly connected components of more than one, Tarjan's)."""
    def unit(module: str) -> str:
        return ".".join(module.split(".")[:2])

    edges: dict[str, set[str]] = {unit(m): set() for m in graph.modules}
    for module in graph.modules:
        edges[unit(module)] |= {unit(d) for d in graph.find_modules_directly_imported_by(module)} - {unit(module)}
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        order[node] = low[node] = len(order)
        stack.append(node)
        for other in edges[node]:
            if other not in order:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], order[other])
        if low[node] == order[node]:
            component = [stack.pop()]
            while component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(edges):
        if node not in order:
            visit(node)
    return cycles


def test_no_two_packages_import_each_other() -> None:
    # The layers contract forbids upward imports between the packages it names; this covers the
    # rest (top-level modules such as app.errors, infra_adapters' packages) and says which cycle.
    assert package_cycles(grimp.build_graph("app", "infra_adapters", cache_dir=None)) == []


def test_a_cycle_between_two_packages_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "loop").mkdir()
    for name, other in (("a", "b"), ("b", "a")):
        (tmp_path / "loop" / name).mkdir()
        (tmp_path / "loop" / name / "__init__.py").write_text("")
        (tmp_path / "loop" / name / "m.py").write_text(f"from loop.{other} import m\n")
    (tmp_path / "loop" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))

    assert package_cycles(grimp.build_graph("loop", cache_dir=None)) == [["loop.a", "loop.b"]]
