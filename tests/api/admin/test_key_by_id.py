"""GET /admin/keys/{id}: one key of either kind, as its list shows it, for every reader and for
a project-admin its projects' keys only."""

from __future__ import annotations

import hashlib

from tests.support import Stack, assert_error, body


def test_a_key_is_shown_as_its_list_shows_it(stack: Stack) -> None:
    with stack.client("admin") as admin:
        made = body(admin.post("/admin/projects/acme/keys", json={"name": "ci"}), 201)
        [listed] = [k for k in body(admin.get("/admin/projects/acme/keys"), 200)["data"] if k["id"] == made["id"]]
        assert body(admin.get(f"/admin/keys/{made['id']}"), 200) == listed
        ops = body(admin.post("/admin/admin-keys", json={"name": "ops", "role": "viewer"}), 201)
        [admin_listed] = [k for k in body(admin.get("/admin/admin-keys"), 200)["data"] if k["id"] == ops["id"]]
        shown = admin.get(f"/admin/keys/{ops['id']}")
        assert body(shown, 200) == admin_listed and admin_listed["role"] == "viewer"
    for secret in (made["key"], ops["key"], hashlib.sha256(made["key"].encode()).hexdigest()):
        assert secret not in shown.text


def test_an_unknown_or_malformed_id_is_a_clear_error(stack: Stack) -> None:
    with stack.client("admin") as admin:
        assert "999999" in assert_error(admin.get("/admin/keys/999999"), 404)["error"]
        assert_error(admin.get("/admin/keys/99999999999999999999"), 404)
        assert_error(admin.get("/admin/keys/abc"), 400)
        assert_error(admin.get("/admin/keys/0"), 404)


def test_a_project_admin_reads_its_projects_keys_only(stack: Stack) -> None:
    stack.new_project("beta")
    with stack.client("admin") as owner:
        scoped = body(owner.post("/admin/admin-keys", json={"role": "project-admin", "projects": ["acme"]}), 201)
        own = body(owner.post("/admin/projects/acme/keys", json={}), 201)["id"]
        other = body(owner.post("/admin/projects/beta/keys", json={}), 201)["id"]
    with stack.gateway.client(scoped["key"]) as client:
        assert body(client.get(f"/admin/keys/{own}"), 200)["project"] == "acme"
        for refused in (other, scoped["id"], 999999):  # another project's, an admin key, none: alike
            assert_error(client.get(f"/admin/keys/{refused}"), 403)
