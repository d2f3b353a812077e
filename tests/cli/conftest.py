"""The command line run in this process (``app.cli.main``), in either mode: ``local`` on the test
database, ``remote`` against the stack's gateway on loopback with an owner's key from a file. The
two modes share the database, so one command can be run both ways and its outputs compared."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.cli import main
from tests.support import Stack

MODES = ("local", "remote")


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def last_line(self) -> str:
        return self.out.strip().splitlines()[-1]

    def error_line(self, *words: str) -> str:
        """A failed command: non-zero, one line on stderr that says why, nothing of a key."""
        assert self.code != 0, self
        lines = self.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("arbiter: "), self.err
        assert "arb_" not in self.out + self.err and "Traceback" not in self.err
        for word in words:
            assert word in lines[0], lines[0]
        return lines[0]


Run = Callable[..., Result]


@pytest.fixture
def key_file(tmp_path: Path, stack: Stack) -> Path:
    path = tmp_path / "admin-key"
    path.write_text(stack.admin_key + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def cli(stack: Stack, key_file: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> Run:
    """``cli(mode, *args)``: the command's exit code and output. No ARBITER_ variable of the
    test run reaches it but the database's (and, remote, the server's address and key file)."""
    for name in [n for n in os.environ if n.startswith("ARBITER_") and n != "ARBITER_SECRET_KEY"]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("ARBITER_DATABASE_URL", stack.db.url)

    def run(mode: str, *args: str, env: dict[str, str] | None = None) -> Result:
        with monkeypatch.context() as scoped:
            if mode == "remote":
                scoped.setenv("ARBITER_URL", stack.gateway.url)
                scoped.setenv("ARBITER_ADMIN_KEY_FILE", str(key_file))
            for name, value in (env or {}).items():
                scoped.setenv(name, value)
            capsys.readouterr()
            try:
                code = main(list(args))
            except SystemExit as exc:  # argparse, and the commands' own usage errors
                if isinstance(exc.code, str):
                    print(exc.code, file=sys.stderr)
                    code = 1
                else:
                    code = int(exc.code or 0)
            captured = capsys.readouterr()
            return Result(code, captured.out, captured.err)

    return run


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)
