"""The ``arbiter`` command line, run as a user runs it: a subprocess on a fresh SQLite file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from infra_adapters.emulators.ollama import OllamaState, make_ollama_app
from infra_adapters.emulators.server import EmulatorServer
from tests.support import assert_error, decision, free_port

ARBITER = str(Path(sys.executable).with_name("arbiter"))


def arbiter(env: dict[str, str], *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([ARBITER, *args], env=env, capture_output=True, text=True, timeout=60,
                            check=False)
    if ok:
        assert result.returncode == 0, (args, result.stdout, result.stderr)
    return result


def assert_one_line_error(result: subprocess.CompletedProcess[str], *words: str) -> str:
    """A failed command: non-zero, one line on stderr that says why, no traceback, no key."""
    assert result.returncode != 0, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("arbiter: "), result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert "arb_" not in result.stdout
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def last_line(result: subprocess.CompletedProcess[str]) -> str:
    return result.stdout.strip().splitlines()[-1]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A fresh, unmigrated SQLite database of its own (not the shared test database)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ARBITER_")}
    return {**clean, "ARBITER_DATABASE_URL": f"sqlite:///{tmp_path / 'cli.db'}", "ARBITER_LOG_LEVEL": "WARNING"}


@pytest.fixture
def migrated(env: dict[str, str]) -> dict[str, str]:
    result = arbiter(env, "migrate")
    assert "latest migration" in result.stdout
    return env


@pytest.fixture
def emulator() -> Iterator[EmulatorServer]:
    with EmulatorServer(make_ollama_app(OllamaState())) as server:
        yield server


@pytest.fixture
def serve(migrated: dict[str, str]) -> Iterator[Callable[[], str]]:
    """Starts ``arbiter serve --port P`` in a process of its own; returns its base URL.
    At the end it is sent SIGTERM and must exit cleanly."""
    processes: list[subprocess.Popen[str]] = []

    def start() -> str:
        port = free_port()
        process = subprocess.Popen([ARBITER, "serve", "--port", str(port)], env=migrated,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        processes.append(process)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60  # generous: CI runs two passes at once on two cores
        while True:
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "arbiter serve did not answer /healthz"
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    return url
            except httpx.TransportError:
                time.sleep(0.05)

    yield start
    for process in processes:
        process.send_signal(signal.SIGTERM)
        try:
            _, stderr = process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise
        assert process.returncode == 0, (process.returncode, stderr)
        assert "Traceback" not in stderr, stderr


def test_commands_refuse_an_unmigrated_database(env: dict[str, str]) -> None:
    serve = arbiter(env, "serve", "--port", str(free_port()), ok=False)
    assert_one_line_error(serve, "not migrated", "arbiter migrate")
    for args in (["admin", "create-key"], ["key", "create", "--project", "acme"], ["project", "create", "acme"]):
        assert_one_line_error(arbiter(env, *args, ok=False), "arbiter migrate")
    for _ in range(2):  # a second run is harmless
        assert "latest migration" in arbiter(env, "migrate").stdout
    assert last_line(arbiter(env, "admin", "create-key")).startswith("arb_admin_")


def test_keys_made_on_the_command_line_work_over_http(migrated: dict[str, str], emulator: EmulatorServer,
                                                      serve: Callable[[], str]) -> None:
    added = arbiter(migrated, "service", "add", "--type", "ollama-external", "--url", emulator.url,
                    "--name", "lab")
    assert "service 'lab' added (ollama-external, version 0.35.0)" in added.stdout
    assert "model nimble (decision)" in added.stdout and ":latest" not in added.stdout
    project = arbiter(migrated, "project", "create", "acme", "--models", "nimble,clef")
    assert "project 'acme' created" in project.stdout
    admin_key = last_line(arbiter(migrated, "admin", "create-key", "--name", "ops"))
    project_key = last_line(arbiter(migrated, "key", "create", "--project", "acme", "--name", "ci"))
    assert admin_key.startswith("arb_admin_") and len(admin_key) > 40 and " " not in admin_key
    assert project_key.startswith("arb_proj_") and len(project_key) > 40 and " " not in project_key
    served = serve()
    with httpx.Client(base_url=served, headers={"Authorization": f"Bearer {project_key}"}) as tenant:
        models = tenant.get("/v1/models")
        assert models.status_code == 200, models.text
        assert [m["id"] for m in models.json()["data"]] == ["clef", "nimble"]
        assert tenant.post("/v1/systemone", json=decision("nimble")).status_code == 200
        assert_error(tenant.post("/v1/systemone", json=decision("llama3.2")), 403)
        assert_error(tenant.get("/admin/projects"), 401)
    with httpx.Client(base_url=served, headers={"Authorization": f"Bearer {admin_key}"}) as admin:
        acme = admin.get("/admin/projects/acme")
        assert acme.status_code == 200 and acme.json()["models"] == ["clef", "nimble"]
        [key] = admin.get("/admin/projects/acme/keys").json()["data"]
        assert (key["name"], key["last_four"]) == ("ci", project_key[-4:])
        audit = admin.get("/admin/audit").json()["data"]
        assert {e["actor"] for e in audit} == {"cli"}
        assert [e["action"] for e in audit] == ["project_key.create", "admin_key.create", "project.create",
                                                "service.create"]
        assert project_key not in str(audit) and admin_key not in str(audit)
        assert_error(admin.get("/v1/models"), 401)


def test_admin_keys_get_their_role_on_the_command_line(migrated: dict[str, str],
                                                       serve: Callable[[], str]) -> None:
    arbiter(migrated, "project", "create", "acme")
    scoped = last_line(arbiter(migrated, "admin", "create-key", "--role", "project-admin", "--project", "acme"))
    owner = last_line(arbiter(migrated, "admin", "create-key"))  # no --role: an owner
    assert_one_line_error(arbiter(migrated, "admin", "create-key", "--role", "viewer", "--project", "acme", ok=False),
                          "only for project-admin")
    assert_one_line_error(arbiter(migrated, "admin", "create-key", "--role", "project-admin", ok=False),
                          "needs its projects")
    served = serve()
    with httpx.Client(base_url=served, headers={"Authorization": f"Bearer {scoped}"}) as admin:
        assert admin.get("/admin/projects/acme").status_code == 200
        assert_error(admin.get("/admin/services"), 403, "permission_error")
    with httpx.Client(base_url=served, headers={"Authorization": f"Bearer {owner}"}) as admin:
        roles = {k["role"]: k["projects"] for k in admin.get("/admin/admin-keys").json()["data"]}
        assert roles == {"project-admin": ["acme"], "owner": []}


def test_what_the_command_line_adds_reaches_a_running_gateway(
        migrated: dict[str, str], emulator: EmulatorServer, serve: Callable[[], str]) -> None:
    migrated["ARBITER_REGISTRY_REFRESH_INTERVAL"] = "0.2"
    served = serve()
    arbiter(migrated, "project", "create", "late")
    admin_key = last_line(arbiter(migrated, "admin", "create-key"))
    project_key = last_line(arbiter(migrated, "key", "create", "--project", "late"))
    projects = httpx.get(f"{served}/admin/projects", headers={"Authorization": f"Bearer {admin_key}"})
    assert [p["name"] for p in projects.json()["data"]] == ["late"]
    with httpx.Client(base_url=served, headers={"Authorization": f"Bearer {project_key}"}) as tenant:
        assert tenant.get("/v1/models").json() == {"object": "list", "data": [], "models": []}
        arbiter(migrated, "service", "add", "--type", "ollama-external", "--url", emulator.url)
        deadline = time.monotonic() + 10
        while not tenant.get("/v1/models").json()["data"]:
            assert time.monotonic() < deadline, "the new service's models never appeared"
            time.sleep(0.1)
        assert [m["id"] for m in tenant.get("/v1/models").json()["data"]] == ["clef", "llama3.2", "nimble"]


def test_errors_are_one_line(migrated: dict[str, str], emulator: EmulatorServer) -> None:
    assert_one_line_error(arbiter(migrated, "key", "create", "--project", "nope", ok=False), "'nope'")
    arbiter(migrated, "project", "create", "acme")
    assert_one_line_error(arbiter(migrated, "project", "create", "acme", ok=False), "already exists")
    assert_one_line_error(arbiter(migrated, "project", "create", "x", "--organization", "nope", ok=False),
                          "'nope'")
    assert last_line(arbiter(migrated, "organization", "create", "nope")) == "organization 'nope' created"
    arbiter(migrated, "project", "create", "x", "--organization", "nope")  # now it exists
    assert_one_line_error(arbiter(migrated, "organization", "create", "nope", ok=False), "already exists")
    port = free_port()
    down = arbiter(migrated, "service", "add", "--type", "ollama-external", "--url", f"http://127.0.0.1:{port}",
                   ok=False)
    # The database mode is its own server: the precise reason is logged (a warning line on stderr), the
    # error is the one every failure of the backend gets (docs/admin.md).
    reason, error = down.stderr.strip().splitlines()
    assert f"cannot reach http://127.0.0.1:{port}" in reason and "Traceback" not in down.stderr
    assert error == (f"arbiter: cannot add service 'ollama-external-127.0.0.1-{port}': could not read ollama-external "
                     f"backend at http://127.0.0.1:{port}: it did not answer as an ollama-external server "
                     "(see the server log)")
    bad_url = arbiter(migrated, "service", "add", "--type", "vllm", "--url", "ftp://127.0.0.1", ok=False)
    assert_one_line_error(bad_url, "http(s)://")
    lab = ("service", "add", "--type", "ollama-external", "--url", emulator.url, "--name", "lab")
    arbiter(migrated, *lab)
    again = arbiter(migrated, *lab, ok=False)
    assert_one_line_error(again, "'lab'", "already exists")


def test_an_old_ollama_is_added_without_its_decision_models(migrated: dict[str, str]) -> None:
    with EmulatorServer(make_ollama_app(OllamaState(version="0.34.9"))) as server:
        added = arbiter(migrated, "service", "add", "--type", "ollama-external", "--url", server.url)
    assert "version 0.34.9" in added.stdout and "model llama3.2 (completion, tools)" in added.stdout
    assert "model nimble" not in added.stdout
    assert ("skipped nimble: Decision models need Ollama 0.35.0 or newer; this Ollama is 0.34.9."
            in added.stdout)


@pytest.mark.parametrize(("variable", "value", "words"), [
    ("ARBITER_PORT", "abc", ("ARBITER_PORT",)),
    ("ARBITER_PORT", "99999", ("ARBITER_PORT", "65535")),
    ("ARBITER_SYNC_INTERVAL", "0", ("ARBITER_SYNC_INTERVAL", "greater than 0")),
    ("ARBITER_LOG_LEVEL", "verbose", ("ARBITER_LOG_LEVEL", "INFO")),
    ("ARBITER_SECRET_KEY", "CHANGE-ME", ("ARBITER_SECRET_KEY", "placeholder")),
    ("ARBITER_MESH_KEY", "sekrit", ("ARBITER_MESH_KEY", "at least 32 characters", "secrets.token_urlsafe(32)")),
    ("ARBITER_DATABASE_URL", "foo://sekrit@", ("ARBITER_DATABASE_URL",)),
    ("ARBITER_DATABASE_URL", "postgresql://u:sekrit@127.0.0.1:1/db", ("cannot use the database",)),
])
def test_a_bad_setting_is_one_line_naming_it(env: dict[str, str], variable: str, value: str,
                                              words: tuple[str, ...]) -> None:
    commands: tuple[tuple[str, ...], ...] = (("serve",), ("migrate",))
    if value.startswith("postgresql"):  # a server database away: serve waits for it (tests/e2e/test_serve.py)
        commands = (("migrate",),)
    for command in commands:
        line = assert_one_line_error(arbiter({**env, variable: value}, *command, ok=False), *words)
        assert "sekrit" not in line and "CHANGE-ME" not in line


def test_aliases_on_the_command_line_serve_over_http(migrated: dict[str, str], emulator: EmulatorServer,
                                                     serve: Callable[[], str]) -> None:
    arbiter(migrated, "service", "add", "--type", "ollama-external", "--url", emulator.url, "--name", "lab")
    added = arbiter(migrated, "alias", "add", "jev-latest", "--model", "nimble")
    assert "alias 'jev-latest' added for model 'nimble'" in added.stdout
    assert arbiter(migrated, "alias", "list").stdout.strip() == "jev-latest -> nimble (active)"
    assert_one_line_error(arbiter(migrated, "alias", "add", "clef", "--model", "nimble", ok=False), "shadow")
    assert_one_line_error(arbiter(migrated, "alias", "add", "two", "--model", "jev-latest", ok=False), "alias")
    assert_one_line_error(arbiter(migrated, "alias", "add", "x", "--model", "ghost", ok=False), "not installed")
    arbiter(migrated, "project", "create", "acme", "--models", "nimble")
    project_key = last_line(arbiter(migrated, "key", "create", "--project", "acme"))
    served = serve()
    with httpx.Client(base_url=served, headers={"Authorization": f"Bearer {project_key}"}) as tenant:
        answer = tenant.post("/v1/systemone", json=decision("jev-latest"))
        assert answer.status_code == 200 and answer.json()["model"] == "jev-latest", answer.text
    assert "alias 'jev-latest' removed" in arbiter(migrated, "alias", "remove", "jev-latest").stdout
    assert arbiter(migrated, "alias", "list").stdout.strip() == "no aliases"
    assert_one_line_error(arbiter(migrated, "alias", "remove", "jev-latest", ok=False), "does not exist")


def test_version_prints_the_installed_version(env: dict[str, str]) -> None:
    from importlib.metadata import version

    result = arbiter(env, "--version")  # no database needed
    assert result.stdout.strip() == f"arbiter {version('arbiter')}"


def test_project_create_warns_of_models_not_installed_and_creates_it(migrated: dict[str, str],
                                                                     emulator: EmulatorServer) -> None:
    arbiter(migrated, "service", "add", "--type", "ollama-external", "--url", emulator.url)
    arbiter(migrated, "alias", "add", "jev-latest", "--model", "nimble")
    quiet = arbiter(migrated, "project", "create", "acme", "--models", "nimble,clef")
    assert quiet.stderr == ""
    warned = arbiter(migrated, "project", "create", "shop", "--models", "nimble,nimbel,jev-latest")
    assert "project 'shop' created" in warned.stdout
    assert warned.stderr.splitlines() == [
        "arbiter: warning: 'jev-latest' is an alias: allow its model 'nimble' instead",
        ("arbiter: warning: model 'nimbel' is not installed here (check the name, or add the service "
         "that provides it: arbiter service add)"),
    ]
    assert arbiter(migrated, "project", "create", "open", "--models", "all").stderr == ""


def test_model_set_turns_an_embedding_model_into_a_decision_model(
        migrated: dict[str, str], serve: Callable[[], str]) -> None:
    state = OllamaState()
    state.models["nomic-embed-text"] = ["embedding"]
    with EmulatorServer(make_ollama_app(state)) as embedder:
        arbiter(migrated, "service", "add", "--type", "ollama-external", "--url", embedder.url, "--name", "lab")
        _set_and_use(migrated, serve)


def _set_and_use(migrated: dict[str, str], serve: Callable[[], str]) -> None:
    set_up = arbiter(migrated, "model", "set", "nomic-embed-text", "--read-strategy", "embeddings",
                     "--temperature", "0.05")
    assert "model 'nomic-embed-text' on 'lab' updated" in set_up.stdout
    assert_one_line_error(arbiter(migrated, "model", "set", "nimble", "--read-strategy", "embeddings", ok=False),
                          "needs an embedding model")
    assert_one_line_error(arbiter(migrated, "model", "set", "nope", "--timeout", "5", ok=False), "no model 'nope'")
    assert_one_line_error(arbiter(migrated, "model", "set", "nimble", ok=False), "nothing to set")
    arbiter(migrated, "project", "create", "acme")
    project_key = last_line(arbiter(migrated, "key", "create", "--project", "acme"))
    admin_key = last_line(arbiter(migrated, "admin", "create-key"))
    served = serve()
    with httpx.Client(base_url=served, headers={"Authorization": f"Bearer {admin_key}"}) as admin:
        [card] = [m for m in admin.get("/admin/models").json()["data"] if m["public_name"] == "nomic-embed-text"]
    assert card["read_strategy"] == "embeddings" and card["embedding_temperature"] == 0.05
    with httpx.Client(base_url=served, headers={"Authorization": f"Bearer {project_key}"}, timeout=30) as tenant:
        answer = tenant.post("/v1/systemone", json=decision("nomic-embed-text"))
    assert answer.status_code == 200, answer.text
    assert answer.json()["diagnostics"]["team"]["label_mass"] == 1
