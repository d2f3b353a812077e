"""Admin roles (SPEC §3): every admin route for every role, allowed or 403 and audited; a
project-admin's scope; roles on new and rotated admin keys; a project key's own usage."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi.routing import iter_route_contexts

from tests.support import Stack, assert_error, body, decision, wait_for

ROLES = ("owner", "operator", "viewer", "project-admin")
# What each admin route needs, written down here independently of app/tenancy/roles.py: a new
# route fails test_every_admin_route_is_in_the_matrix until it has a line here (and its
# ``needs(...)``, without which the app does not even build).
POLICY = {
    "POST /admin/organizations": "owner",
    "GET /admin/organizations": "read",
    "GET /admin/organizations/{name}": "read",
    "PATCH /admin/organizations/{name}": "owner",
    "GET /admin/projects": "scoped-read",
    "POST /admin/projects": "owner",
    "GET /admin/projects/{name}": "project-read",
    "PATCH /admin/projects/{name}": "project-manage",
    "GET /admin/projects/{name}/keys": "project-read",
    "POST /admin/projects/{name}/keys": "project-manage",
    "GET /admin/projects/{name}/usage": "project-read",
    "GET /admin/admin-keys": "read",
    "POST /admin/admin-keys": "owner",
    "GET /admin/keys/{key_id}": "key-read",
    "PATCH /admin/keys/{key_id}": "key-manage",
    "POST /admin/keys/{key_id}/revoke": "key-manage",
    "POST /admin/keys/{key_id}/rotate": "key-manage",
    "GET /admin/audit": "read",
    "GET /admin/usage": "scoped-read",
    "GET /admin/usage/recent": "scoped-read",
    "GET /admin/services": "read",
    "POST /admin/services": "operate",
    "GET /admin/services/{name}": "read",
    "PATCH /admin/services/{name}": "operate",
    "DELETE /admin/services/{name}": "operate",
    "POST /admin/services/{name}/refresh": "operate",
    "GET /admin/services/{name}/models": "read",
    "GET /admin/models": "read",
    "GET /admin/catalog": "read",
    "POST /admin/services/{name}/models": "operate",
    "DELETE /admin/services/{name}/models/{model}": "operate",
    "GET /admin/installs": "read",
    "GET /admin/installs/{install_id}": "read",
    "POST /admin/installs/{install_id}/cancel": "operate",
    "GET /admin/models/{model_id}": "read",
    "PATCH /admin/models/{model_id}": "operate",
    "POST /admin/models/{model_id}/test": "operate",
    "GET /admin/mesh": "read",
    "POST /admin/mesh/peers": "operate",
    "DELETE /admin/mesh/peers/{peer_id}": "operate",
    "GET /admin/aliases": "read",
    "POST /admin/aliases": "operate",
    "DELETE /admin/aliases/{alias}": "operate",
}
# Who may, on the project-admin's own project ("acme"): the project needs are its there.
ALLOWED = {
    "owner": {"owner"},
    "operate": {"owner", "operator"},
    "read": {"owner", "operator", "viewer"},
    "scoped-read": set(ROLES),
    "project-read": set(ROLES),
    "project-manage": {"owner", "project-admin"},
    "key-manage": {"owner", "project-admin"},
    "key-read": set(ROLES),
}


def admin_routes(stack: Stack) -> list[tuple[str, str]]:
    """(method, template) of every /admin route the app serves, from its routes (not its docs)."""
    found = []
    for context in iter_route_contexts(stack.gateway.app.fastapi.routes):
        path = (context.path or "").replace("{model:path}", "{model}").replace("{alias:path}", "{alias}").replace(
            "{name:path}", "{name}")
        if path.startswith("/admin"):
            found += [(method, path) for method in sorted(context.methods or ()) if method != "HEAD"]
    return found


def keys_by_role(stack: Stack) -> dict[str, str]:
    """An admin key of each role (the project-admin manages 'acme'), made by the owner."""
    stack.new_project("beta")
    made = {"owner": stack.admin_key}
    with stack.client("admin") as owner:
        for role in ROLES[1:]:
            fields: dict[str, Any] = {"role": role, "name": role}
            if role == "project-admin":
                fields["projects"] = ["acme"]
            made[role] = body(owner.post("/admin/admin-keys", json=fields), 201)["key"]
    return made


def project_key_id(stack: Stack, project: str) -> int:
    with stack.client("admin") as owner:
        return int(body(owner.post(f"/admin/projects/{project}/keys", json={"name": "target"}), 201)["id"])


def filled(path: str, key_id: int) -> str:
    """A route's path with targets that exist where a refusal depends on them (the project-admin's
    project, a key of it) and that do not where an allowed call would change something."""
    name = "acme" if path.startswith("/admin/projects/") else "nosuch"
    return (path.replace("{name}", name).replace("{key_id}", str(key_id)).replace("{model}", "nimble")
            .replace("{alias}", "nosuch").replace("{model_id}", "999999").replace("{install_id}", "999999")
            .replace("{peer_id}", "999999"))


def call(client: httpx.Client, method: str, path: str) -> httpx.Response:
    """Bodies break the schema: an allowed change gets its 400 and changes nothing."""
    extra = {"json": {"unknown": 1}} if method in ("POST", "PATCH") else {}
    return client.request(method, path, **extra)


def denials(stack: Stack) -> list[dict[str, Any]]:
    with stack.client("admin") as owner:
        entries = body(owner.get("/admin/audit", params={"limit": 1000}), 200)["data"]
    return [e for e in entries if e["action"] == "permission.denied"]


def test_every_admin_route_is_in_the_matrix(stack: Stack) -> None:
    routes = {f"{method} {path}" for method, path in admin_routes(stack)}
    assert routes == set(POLICY), {"not in POLICY": routes - set(POLICY), "gone": set(POLICY) - routes}
    for context in iter_route_contexts(stack.gateway.app.fastapi.routes):  # and each declares that need
        path = (context.path or "").replace("{model:path}", "{model}").replace("{alias:path}", "{alias}").replace(
            "{name:path}", "{name}")
        for method in context.methods or () if path.startswith("/admin") else ():
            assert context.original_route.permission.need.value == POLICY[f"{method} {path}"]  # type: ignore[union-attr]


def test_each_role_gets_what_it_may_and_403_for_the_rest(stack: Stack) -> None:
    keys = keys_by_role(stack)
    key_id = project_key_id(stack, "acme")
    refused: list[tuple[str, str]] = []
    for role, key in keys.items():
        with stack.gateway.client(key) as client:
            for method, template in admin_routes(stack):
                response = call(client, method, filled(template, key_id))
                if role in ALLOWED[POLICY[f"{method} {template}"]]:
                    assert response.status_code != 403, (role, method, template, response.text)
                else:
                    error = assert_error(response, 403, "permission_error")
                    assert role in error["error"], error
                    refused.append((role, f"{method} {template}"))
    assert len(refused) > 30, refused
    # Every refusal is counted, folded into one entry per key and minute (app/audit.py fold_key):
    # each role's entries count all its refusals, and name only routes it was refused.
    counted: dict[str, int] = {}
    for e in denials(stack):
        role, route = e["details"]["role"], e["target"].removeprefix("route:").replace(":path}", "}")
        assert (role, route) in refused, (role, route)
        counted[role] = counted.get(role, 0) + e["count"]
    assert counted == {role: sum(1 for r, _ in refused if r == role) for role, _ in refused}
    entry = denials(stack)[0]
    assert entry["actor"].startswith("admin-key:") and entry["request_id"]
    assert all(secret not in str(denials(stack)) for secret in keys.values())


def test_a_refusal_comes_before_the_body_is_read(stack: Stack) -> None:
    keys = keys_by_role(stack)
    with stack.gateway.client(keys["viewer"]) as viewer:
        garbled = viewer.post("/admin/services", content=b"{not json", headers={"Content-Type": "application/json"})
        assert_error(garbled, 403, "permission_error")


def test_only_an_owner_makes_admin_keys_and_a_rotation_keeps_the_role(stack: Stack) -> None:
    keys = keys_by_role(stack)
    with stack.client("admin") as owner:
        listed = {k["name"]: k for k in body(owner.get("/admin/admin-keys"), 200)["data"]}
        assert listed["operator"]["role"] == "operator" and listed["operator"]["projects"] == []
        assert listed["project-admin"]["projects"] == ["acme"]
        assert {k["role"] for k in listed.values() if k["name"] not in ROLES} == {"owner"}  # the stack's
        default = body(owner.post("/admin/admin-keys", json={"name": "plain"}), 201)
        assert default["role"] == "owner"  # omitted: the owner's own role
        for fields in ({"role": "project-admin"}, {"role": "viewer", "projects": ["acme"]}, {"role": "root"},
                       {"role": "project-admin", "projects": []}):
            assert_error(owner.post("/admin/admin-keys", json=fields), 400)
        assert_error(owner.post("/admin/admin-keys", json={"role": "project-admin", "projects": ["nope"]}), 404)
        rotated = body(owner.post(f"/admin/keys/{listed['project-admin']['id']}/rotate", json={}), 201)
        successor = next(k for k in body(owner.get("/admin/admin-keys"), 200)["data"] if k["id"] == rotated["id"])
        assert (successor["role"], successor["projects"]) == ("project-admin", ["acme"])
    for role in ("operator", "viewer", "project-admin"):
        with stack.gateway.client(keys[role]) as client:
            for fields in ({"role": "owner"}, {"role": "viewer"}, {}):
                assert_error(client.post("/admin/admin-keys", json=fields), 403, "permission_error")
    with stack.gateway.client(rotated["key"]) as successor_client:  # the successor is a project-admin too
        assert_error(successor_client.get("/admin/services"), 403, "permission_error")
        assert body(successor_client.get("/admin/projects/acme"), 200)["name"] == "acme"


def test_a_project_admin_manages_only_its_projects(stack: Stack) -> None:
    keys = keys_by_role(stack)
    beta_key = project_key_id(stack, "beta")
    with stack.client("admin") as owner:
        owner_key = next(k["id"] for k in body(owner.get("/admin/admin-keys"), 200)["data"] if k["role"] == "owner")
    decisions_for(stack, stack.project_key, 2)
    decisions_for(stack, stack.new_project("gamma"), 1)
    with stack.gateway.client(keys["project-admin"]) as scoped:
        assert [p["name"] for p in body(scoped.get("/admin/projects"), 200)["data"]] == ["acme"]
        made = body(scoped.post("/admin/projects/acme/keys", json={"name": "ci"}), 201)
        assert body(scoped.patch(f"/admin/keys/{made['id']}", json={"requests_per_minute": 5}), 200)
        assert body(scoped.post(f"/admin/keys/{made['id']}/revoke"), 200)["revoked_at"]
        assert body(scoped.patch("/admin/projects/acme", json={"requests_per_minute": 100}), 200)
        for method, path, payload in (
                ("POST", "/admin/projects/beta/keys", {}), ("GET", "/admin/projects/beta", None),
                ("GET", "/admin/projects/beta/usage", None), ("GET", "/admin/projects/nope", None),
                ("POST", f"/admin/keys/{beta_key}/revoke", None), ("POST", f"/admin/keys/{owner_key}/revoke", None),
                ("POST", "/admin/keys/999999/revoke", None), ("PATCH", "/admin/projects/acme", {"models": ["nimble"]}),
                ("PATCH", "/admin/projects/acme", {"archived": True}),
                ("GET", "/admin/usage/recent?project=gamma", None), ("GET", "/admin/audit", None),
                ("GET", "/admin/services", None)):
            assert_error(scoped.request(method, path, json=payload), 403, "permission_error")
        rows = wait_for(lambda: body(scoped.get("/admin/usage"), 200)["data"])
        assert {r["project"] for r in rows} == {"acme"}
        assert {r["project"] for r in body(scoped.get("/admin/usage/recent"), 200)["data"]} == {"acme"}
        assert body(scoped.get("/admin/projects/acme/usage"), 200)["data"]
    with stack.client("admin") as owner:
        assert body(owner.get("/admin/projects/acme"), 200)["models"] == "all"  # its refused change did nothing
        # gamma's record may reach the ledger a batch after acme's, which the scoped reads waited for.
        assert wait_for(lambda: {r["project"] for r in body(owner.get("/admin/usage"), 200)["data"]}
                        == {"acme", "gamma"})


def decisions_for(stack: Stack, key: str, count: int) -> None:
    with stack.gateway.client(key) as client:
        for _ in range(count):
            assert client.post("/v1/systemone", json=decision("nimble")).status_code == 200


def test_a_project_key_reads_its_own_usage(stack: Stack) -> None:
    other = stack.new_project("beta")
    decisions_for(stack, stack.project_key, 3)
    decisions_for(stack, other, 1)
    with stack.client() as client:
        # The ledger writes in batches: wait for all three, not the first batch to land.
        answer = wait_for(lambda: (a := body(client.get("/v1/usage"), 200))["data"]
                          and sum(r["requests"] for r in a["data"]) >= 3 and a)
        assert answer["project"] == "acme" and {r["project"] for r in answer["data"]} == {"acme"}
        assert sum(r["requests"] for r in answer["data"]) == 3 and answer["data"][0]["model"] == "nimble"
        recent = body(client.get("/v1/usage", params={"days": 1}), 200)
        assert recent["since"] and sum(r["requests"] for r in recent["data"]) == 3
        assert body(client.get("/v1/usage", params={"since": "2000-01-01", "until": "2000-01-02"}), 200)["data"] == []
        assert_error(client.get("/v1/usage", params={"days": 1, "since": "2000-01-01"}), 400)
        assert_error(client.get("/v1/usage", params={"days": 0}), 400)
    with stack.gateway.client(other) as beta:
        assert sum(r["requests"] for r in wait_for(lambda: body(beta.get("/v1/usage"), 200)["data"])) == 1
    with stack.client("admin") as admin:
        assert_error(admin.get("/v1/usage"), 401)


@pytest.mark.parametrize("role", ["operator", "viewer"])
def test_roles_outside_keys_cannot_touch_a_key(stack: Stack, role: str) -> None:
    keys = keys_by_role(stack)
    target = project_key_id(stack, "acme")
    with stack.gateway.client(keys[role]) as client:
        assert_error(client.post(f"/admin/keys/{target}/revoke"), 403, "permission_error")
        assert_error(client.post("/admin/projects/acme/keys", json={}), 403, "permission_error")
    with stack.client("admin") as owner:
        assert next(k for k in body(owner.get("/admin/projects/acme/keys"), 200)["data"]
                    if k["id"] == target)["revoked_at"] is None


@pytest.mark.parametrize("role", ["owner", "project-admin"])
def test_a_key_id_of_a_digit_that_is_no_number_is_a_400_never_a_500(stack: Stack, role: str) -> None:
    """str.isdigit() takes "²", which int() cannot read (and the Arabic-Indic 3, which it can)."""
    key = keys_by_role(stack)[role]
    with stack.gateway.client(key) as client:
        for path in ("/admin/keys/%C2%B2", "/admin/keys/%D9%A3"):
            assert_error(client.get(path), 400)
            assert_error(client.post(f"{path}/revoke"), 400)
        assert_error(client.get("/admin/keys/99999999999999999999"), 404 if role == "owner" else 403)
        # More digits than int() reads (4,300): never its ValueError as a 500.
        response = client.get("/admin/keys/" + "9" * 5000)
        assert response.status_code in (400, 403, 404), response.text
