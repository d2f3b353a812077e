"""Whole-process helpers: run `arbiter` commands the way a user would."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

ARBITER = str(Path(sys.executable).with_name("arbiter"))


def run(args: list[str], env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([ARBITER, *args], check=False, env=env, capture_output=True, text=True, timeout=60)
    if check and result.returncode != 0:
        raise AssertionError(f"arbiter {' '.join(args)} failed: {result.stderr}")
    return result


def environment(database_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARBITER_")}
    env["ARBITER_DATABASE_URL"] = database_url
    return env


def wait_ready(url: str, process: subprocess.Popen[bytes] | None = None, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise AssertionError(f"process exited with {process.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} not ready after {timeout}s")


def shop(env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    """An emulated Ollama added as a service, and a project "shop" with a key: (the emulator's
    process, which the caller stops, and the key)."""
    from tests.support import free_port

    port = free_port()
    emulator = subprocess.Popen([ARBITER, "emulate", "ollama", "--port", str(port)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(f"http://127.0.0.1:{port}/api/version", emulator)
        run(["service", "add", "--type", "ollama-external", "--url", f"http://127.0.0.1:{port}"], env)
        run(["project", "create", "shop"], env)
        return emulator, run(["key", "create", "--project", "shop"], env).stdout.strip().splitlines()[-1]
    except BaseException:
        emulator.kill()
        raise
