"""``arbiter completion bash|zsh|fish``: each script completes what the parser has, run in the
real shell (bash always; zsh and fish where they are installed: .ci/run installs them)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from app.cli import _parser
from app.cli.completion import script
from tests.cli.conftest import Run

BASH = """source {script}
comp() {{ COMP_WORDS=("$@"); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); COMPREPLY=(); \
_arbiter; echo "${{COMPREPLY[*]}}"; }}
"""
# The shell's own completion functions stand in for zsh's completion system: each prints what it was given.
ZSH = """compdef() {{ :; }}
source {script}
_describe() {{ local -a given; given=("${{(@P)${{@[-1]}}}}"); print -r -- "${{given[@]%%:*}}"; }}
compadd() {{ shift; print -r -- "$*"; }}
_files() {{ print -r -- "<files>"; }}
comp() {{ words=("$@"); CURRENT=${{#words}}; _arbiter; }}
"""
CASES = [  # the words typed (the last one is being completed), and what must be offered
    (("arbiter", ""), {"serve", "migrate", "secret", "project", "organization", "key", "admin", "service", "model",
                       "alias", "emulate", "completion", "usage"}),
    (("arbiter", "pro"), {"project"}),
    (("arbiter", "project", ""), {"create", "list", "show", "set", "archive", "unarchive"}),
    (("arbiter", "organization", ""), {"create", "list", "show", "rename"}),
    (("arbiter", "key", ""), {"create", "list", "show", "revoke", "rotate"}),
    (("arbiter", "project", "list", "--j"), {"--json"}),
    (("arbiter", "--url", "https://gw", "service", "s"), {"show", "status"}),
    (("arbiter", "admin", "create-key", "--role", ""), {"owner", "operator", "viewer", "project-admin"}),
    (("arbiter", "service", "add", "--type", "v"), {"vllm"}),
    (("arbiter", "completion", ""), {"bash", "zsh", "fish"}),
]


def offered(output: str, typed: str) -> set[str]:
    return {word for word in output.split() if word.startswith(typed)}


def test_the_command_prints_each_script(cli: Run) -> None:
    for shell in ("bash", "zsh", "fish"):
        printed = cli("local", "completion", shell)
        assert printed.code == 0 and printed.out == script(_parser(), shell)
        assert "arbiter" in printed.out and "organization" in printed.out


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_the_script_completes_in_its_shell(shell: str, tmp_path: Path) -> None:
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed here (.ci/run installs it)")
    path = tmp_path / f"arbiter.{shell}"
    path.write_text(script(_parser(), shell))
    check = {"bash": ["bash", "-n"], "zsh": ["zsh", "-n"], "fish": ["fish", "--no-execute"]}[shell]
    subprocess.run([*check, str(path)], check=True, timeout=30)
    for words, expected in CASES:
        assert offered(_complete(shell, path, words), words[-1]) == expected, (shell, words)
    files = _complete(shell, path, ("arbiter", "project", "list", "--admin-key-file", "arb"))
    assert ("<files>" if shell == "zsh" else path.name) in files.split()  # a file option completes files


def _complete(shell: str, path: Path, words: tuple[str, ...]) -> str:
    quoted = " ".join(f"'{w}'" for w in words)
    if shell == "fish":
        line = " ".join(words)
        program = f"source {path}; cd {path.parent}; complete -C '{line}'"
        output = subprocess.run(["fish", "--no-config", "-c", program], capture_output=True, text=True,
                                timeout=30, check=True).stdout
        return "\n".join(row.split("\t")[0] for row in output.splitlines())
    program = (BASH if shell == "bash" else ZSH).format(script=path) + f"cd {path.parent}; comp {quoted}\n"
    return subprocess.run([shell, "-f"] if shell == "zsh" else [shell, "--norc"], input=program, capture_output=True,
                          text=True, timeout=30, check=True).stdout
