"""Every change command in both modes: what it prints, what the admin API then shows, and who the
audit log says made it (``cli`` on the database, the admin key over HTTP)."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.cli.conftest import Result, Run
from tests.support import Stack, body, decision


def audit(stack: Stack) -> list[dict[str, Any]]:
    with stack.client("admin") as admin:
        return body(admin.get("/admin/audit", params={"limit": 1000}), 200)["data"]  # type: ignore[no-any-return]


def api(stack: Stack, path: str) -> Any:
    with stack.client("admin") as admin:
        return body(admin.get(path), 200)


def ok(result: Result) -> Result:
    assert result.code == 0 and result.err == "", result
    return result


def actor_of(mode: str) -> str:
    return "cli" if mode == "local" else "admin-key:"


def test_organizations_and_projects(cli: Run, stack: Stack, mode: str) -> None:
    before = audit(stack)[0]["id"]  # the stack's own set-up
    assert ok(cli(mode, "organization", "create", "initech")).out == "organization 'initech' created\n"
    assert "project 'tps' created (models: nimble)" in ok(cli(mode, "project", "create", "tps", "--organization",
                                                              "initech", "--models", "nimble")).out
    renamed = ok(cli(mode, "organization", "rename", "initech", "Initrode"))
    assert renamed.out == "organization 'initech' renamed to 'Initrode'\n"
    assert api(stack, "/admin/organizations/Initrode")["projects"][0]["name"] == "tps"
    updated = ok(cli(mode, "project", "set", "tps", "--models", "all", "--tokens-per-minute", "5000",
                     "--requests-per-minute", "none"))
    assert updated.out == "project 'tps' updated: requests_per_minute=none, tokens_per_minute=5000, models=all\n"
    assert "archived" in ok(cli(mode, "project", "archive", "acme")).out
    assert api(stack, "/admin/projects/acme")["archived"] is True
    with stack.client() as tenant:  # its key is refused
        assert tenant.post("/v1/systemone", json=decision()).status_code == 403
    assert "unarchived" in ok(cli(mode, "project", "unarchive", "acme")).out
    assert api(stack, "/admin/projects/acme")["archived"] is False
    entries = [e for e in audit(stack) if e["action"].startswith(("organization.", "project.")) and e["id"] > before]
    assert {e["action"] for e in entries} == {"organization.create", "organization.rename", "project.create",
                                              "project.update"}
    assert all(e["actor"].startswith(actor_of(mode)) for e in entries)


def test_project_keys_created_rotated_and_revoked(cli: Run, stack: Stack, mode: str) -> None:
    before = audit(stack)[0]["id"]
    made = ok(cli(mode, "key", "create", "--project", "acme", "--name", "ci", "--expires-at", "2099-01-01T00:00:00Z"))
    value = made.last_line
    assert value.startswith("arb_proj_") and " " not in value
    assert made.out.splitlines()[0].startswith("project key ") and "'acme' created; it is shown once:" in made.out
    key_id = next(k["id"] for k in api(stack, "/admin/projects/acme/keys")["data"] if value.endswith(k["last_four"]))
    assert api(stack, f"/admin/keys/{key_id}")["expires_at"].startswith("2099-01-01T00:00:00")
    with stack.gateway.client(value) as tenant:
        assert tenant.post("/v1/systemone", json=decision()).status_code == 200
    rotated = ok(cli(mode, "key", "rotate", str(key_id), "--grace-seconds", "0"))
    successor = rotated.last_line
    assert successor.startswith("arb_proj_") and successor != value
    assert f"project key {key_id} ('acme') rotated" in rotated.out
    with stack.gateway.client(successor) as tenant:
        assert tenant.post("/v1/systemone", json=decision()).status_code == 200
    assert ok(cli(mode, "key", "show", str(key_id))).out.splitlines()[-1].split() == ["state", "revoked"]
    if mode == "remote":  # the server dropped it from its cache; on the database: test_local_changes_reach_...
        with stack.gateway.client(value) as tenant:  # no grace: the old key is done
            assert tenant.post("/v1/systemone", json=decision()).status_code == 401
    new_id = api(stack, f"/admin/keys/{key_id}")["replaced_by"]
    assert ok(cli(mode, "key", "revoke", str(new_id))).out == f"project key {new_id} ('acme') revoked\n"
    assert api(stack, f"/admin/keys/{new_id}")["revoked_at"] is not None
    if mode == "remote":
        with stack.gateway.client(successor) as tenant:
            assert tenant.post("/v1/systemone", json=decision()).status_code == 401
    actions = [e for e in audit(stack) if e["action"] in ("project_key.create", "key.rotate", "key.revoke")
               and e["id"] > before]
    # created, rotated (and its successor created), revoked
    assert len(actions) == 4 and all(e["actor"].startswith(actor_of(mode)) for e in actions)


def test_admin_keys_created_rotated_and_revoked(cli: Run, stack: Stack, mode: str) -> None:
    made = ok(cli(mode, "admin", "create-key", "--name", "scoped", "--role", "project-admin", "--project", "acme"))
    assert "(project-admin) created; it is shown once:" in made.out
    value = made.last_line
    with stack.gateway.client(value) as scoped:
        assert scoped.get("/admin/projects/acme").status_code == 200
    key_id = next(k["id"] for k in api(stack, "/admin/admin-keys")["data"] if k["name"] == "scoped")
    assert "project-admin" in ok(cli(mode, "admin", "show", str(key_id))).out
    rotated = ok(cli(mode, "admin", "rotate", str(key_id)))
    successor = rotated.last_line
    assert successor.startswith("arb_admin_")
    assert [(k["role"], k["projects"]) for k in api(stack, "/admin/admin-keys")["data"] if k["name"] == "scoped"] \
        == [("project-admin", ["acme"])] * 2  # the successor keeps its role and projects
    assert ok(cli(mode, "admin", "revoke", str(key_id))).out == f"admin key {key_id} revoked\n"
    assert api(stack, f"/admin/keys/{key_id}")["revoked_at"] is not None
    with stack.gateway.client(successor) as new:
        assert new.get("/admin/projects/acme").status_code == 200
    if mode == "remote":
        with stack.gateway.client(value) as old:
            assert old.get("/admin/projects/acme").status_code == 401


def test_a_key_of_the_other_kind_is_refused(cli: Run, stack: Stack, mode: str) -> None:
    owner_id = api(stack, "/admin/admin-keys")["data"][0]["id"]
    project_id = api(stack, "/admin/projects/acme/keys")["data"][0]["id"]
    for action in ("show", "revoke", "rotate"):
        cli(mode, "key", action, str(owner_id)).error_line(f"key {owner_id} is an admin key", "arbiter admin")
        cli(mode, "admin", action, str(project_id)).error_line(f"key {project_id} is a project key", "arbiter key")
    assert api(stack, f"/admin/keys/{owner_id}")["revoked_at"] is None
    assert api(stack, f"/admin/keys/{project_id}")["revoked_at"] is None


def test_services_models_and_aliases(cli: Run, stack: Stack, mode: str) -> None:
    before = audit(stack)[0]["id"]
    refreshed = ok(cli(mode, "service", "refresh", "ollama"))
    assert refreshed.out == "service 'ollama' refreshed (version 0.35.0, reachable)\n"
    assert "jev-latest" in ok(cli(mode, "alias", "add", "jev-latest", "--model", "nimble")).out
    assert ok(cli(mode, "alias", "list")).out == "jev-latest -> nimble (active)\n"
    assert "active" in ok(cli(mode, "alias", "show", "jev-latest")).out
    set_up = ok(cli(mode, "model", "set", "nimble", "--timeout", "12.5"))
    assert set_up.out.startswith("model 'nimble' on 'ollama' updated: timeout=12.5")
    assert "12.5" in ok(cli(mode, "model", "show", "nimble")).out
    assert ok(cli(mode, "alias", "remove", "jev-latest")).out == "alias 'jev-latest' removed\n"
    assert ok(cli(mode, "service", "remove", "ollama")).out == "service 'ollama' removed, and its models\n"
    assert api(stack, "/admin/services")["data"] == [] and api(stack, "/admin/models")["data"] == []
    assert ok(cli(mode, "service", "list")).out == "no services\n"
    assert ok(cli(mode, "model", "list")).out == "no models\n"
    assert ok(cli(mode, "alias", "list")).out == "no aliases\n"
    entries = [e for e in audit(stack) if e["action"] in ("service.refresh", "alias.create", "alias.remove",
                                                          "model.update", "service.delete") and e["id"] > before]
    assert {e["action"] for e in entries} == {"service.refresh", "alias.create", "alias.remove", "model.update",
                                              "service.delete"}
    assert all(e["actor"].startswith(actor_of(mode)) for e in entries)


def test_service_add_in_both_modes(cli: Run, stack: Stack, mode: str) -> None:
    """Remote mode: the gateway's address is ARBITER_URL (service add's own --url is the backend's)."""
    added = ok(cli(mode, "service", "add", "--type", "ollama-external", "--url", stack.ollama.url, "--name", "lab"))
    assert added.out.splitlines()[0] == "service 'lab' added (ollama-external, version 0.35.0)"
    assert "  model nimble (decision)" in added.out
    assert api(stack, "/admin/services/lab")["reachable"] is True


def test_a_local_command_that_calls_a_backend_runs_where_a_loop_runs_already(cli: Run, stack: Stack) -> None:
    """The local mode awaits the backend on an event loop of its own; called from a thread that
    runs one already (a program embedding the CLI, a test driving a browser), it still runs."""
    async def inside_a_loop() -> Result:
        return cli("local", "service", "refresh", "ollama")

    assert ok(asyncio.run(inside_a_loop())).out == "service 'ollama' refreshed (version 0.35.0, reachable)\n"
