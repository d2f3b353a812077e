"""Every read prints the same in both modes, and its --json is exactly the admin API's JSON."""

from __future__ import annotations

import json
from urllib.parse import quote

from tests.cli.conftest import Run
from tests.support import Stack, body

# Each read, and the admin API route whose JSON its --json prints.
READS = [
    (("organization", "list"), "/admin/organizations"),
    (("organization", "show", "initech"), "/admin/organizations/initech"),
    (("project", "list"), "/admin/projects"),
    (("project", "show", "acme"), "/admin/projects/acme"),
    (("key", "list", "--project", "acme"), "/admin/projects/acme/keys"),
    (("key", "show", "{project_key}"), "/admin/keys/{project_key}"),
    (("admin", "list"), "/admin/admin-keys"),
    (("admin", "show", "{admin_key}"), "/admin/keys/{admin_key}"),
    (("service", "list"), "/admin/services"),
    (("service", "show", "ollama"), "/admin/services/ollama"),
    (("model", "list"), "/admin/models"),
    (("model", "list", "--service", "ollama"), "/admin/services/ollama/models"),
    (("model", "show", "nimble"), "/admin/models/{nimble}"),
    (("alias", "list"), "/admin/aliases"),
]


def provision(cli: Run, stack: Stack) -> dict[str, str]:
    """Something of every object, made on the command line; the ids the reads name."""
    assert cli("local", "organization", "create", "initech").code == 0
    assert cli("local", "project", "create", "tps", "--organization", "initech", "--models", "nimble").code == 0
    assert cli("local", "project", "set", "tps", "--requests-per-minute", "60").code == 0
    assert cli("local", "alias", "add", "jev-latest", "--model", "nimble").code == 0
    made = cli("local", "key", "create", "--project", "tps", "--name", "ci")
    assert made.code == 0, made
    with stack.client("admin") as admin:
        keys = body(admin.get("/admin/projects/tps/keys"), 200)["data"]
        owner = body(admin.get("/admin/admin-keys"), 200)["data"][0]
        nimble = next(m for m in body(admin.get("/admin/models"), 200)["data"] if m["public_name"] == "nimble")
    return {"project_key": str(keys[0]["id"]), "admin_key": str(owner["id"]), "nimble": str(nimble["id"])}


def test_every_read_is_the_same_in_both_modes_and_its_json_is_the_apis(cli: Run, stack: Stack) -> None:
    ids = provision(cli, stack)
    with stack.client("admin") as admin:
        for args, route in READS:
            argv = [a.format(**ids) for a in args]
            local, remote = cli("local", *argv), cli("remote", *argv)
            assert local.code == remote.code == 0, (argv, local, remote)
            assert local.out == remote.out and local.out.strip(), (argv, local.out, remote.out)
            local_json, remote_json = cli("local", *argv, "--json"), cli("remote", *argv, "--json")
            assert local_json.out == remote_json.out, argv
            assert json.loads(remote_json.out) == body(admin.get(route.format(**ids)), 200), argv


def test_no_read_shows_a_key_or_a_digest(cli: Run, stack: Stack) -> None:
    import hashlib

    ids = provision(cli, stack)
    made = cli("local", "key", "create", "--project", "acme").last_line
    secrets = [made, stack.admin_key, stack.project_key,
               *(hashlib.sha256(k.encode()).hexdigest() for k in (made, stack.admin_key, stack.project_key))]
    for args, _ in READS:
        for extra in ((), ("--json",)):
            shown = cli("remote", *[a.format(**ids) for a in args], *extra)
            assert not any(s in shown.out + shown.err for s in secrets), args


def test_tables_have_a_header_and_aligned_columns(cli: Run, stack: Stack) -> None:
    provision(cli, stack)
    lines = cli("remote", "project", "list").out.splitlines()
    assert lines[0].split() == ["NAME", "MODELS", "ARCHIVED", "RPM", "TPM", "CREATED"]
    assert [line.split()[0] for line in lines[1:]] == ["acme", "tps"]
    assert len({line.index(line.split()[-1]) for line in lines}) == 1  # CREATED starts in one column
    assert lines[2].split()[1:5] == ["nimble", "no", "60", "-"]
    keys = cli("remote", "key", "list").out.splitlines()  # every project's keys
    assert [line.split()[1] for line in keys[1:]] == ["acme", "tps"]
    assert all("active" in line for line in keys[1:])


def test_service_status_shows_each_service_with_its_models(cli: Run, stack: Stack) -> None:
    status = cli("remote", "service", "status")
    header, row = status.out.splitlines()
    assert header.split()[:4] == ["SERVICE", "REACHABLE", "VERSION", "DECISIONS"]
    assert row.split()[:4] == ["ollama", "yes", "0.35.0", "yes"] and "clef, llama3.2, nimble" in row
    as_json = json.loads(cli("remote", "service", "status", "--json").out)["data"]
    with stack.client("admin") as admin:
        service = body(admin.get("/admin/services/ollama"), 200)
        models = body(admin.get("/admin/services/ollama/models"), 200)["data"]
    assert as_json == [{**service, "models": models}]
    assert cli("local", "service", "status", "--json").out == cli("remote", "service", "status", "--json").out


def test_an_organization_name_with_a_slash_reads_in_both_modes(cli: Run, stack: Stack) -> None:
    assert cli("remote", "organization", "create", "emea/sales").code == 0
    local = cli("local", "organization", "show", "emea/sales")
    remote = cli("remote", "organization", "show", "emea/sales")
    assert local.out == remote.out and "emea/sales" in remote.out
    with stack.client("admin") as admin:
        assert body(admin.get(f"/admin/organizations/{quote('emea/sales', safe='')}"), 200)["name"] == "emea/sales"
