"""Organizations in the admin API (issue #21, item 5): list, show and rename, over real HTTP."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import pytest

from tests.support import Stack, assert_error, body


def audit_entries(stack: Stack, action: str) -> list[dict[str, Any]]:
    with stack.client("admin") as admin:
        return [e for e in body(admin.get("/admin/audit"), 200)["data"] if e["action"] == action]


def test_organizations_are_listed_with_their_projects_names(stack: Stack) -> None:
    with stack.client("admin") as admin:
        body(admin.post("/admin/organizations", json={"name": "initech"}), 201)
        body(admin.post("/admin/organizations", json={"name": "empty"}), 201)
        for project in ("tps", "reports"):
            body(admin.post("/admin/projects", json={"name": project, "organization": "initech"}), 201)
        listed = body(admin.get("/admin/organizations"), 200)["data"]
    assert [(o["name"], o["projects"]) for o in listed] == [
        ("default", ["acme"]), ("empty", []), ("initech", ["reports", "tps"])]
    assert all(set(o) == {"id", "name", "created_at", "projects"} and o["created_at"] for o in listed)


def test_an_organization_is_shown_with_its_projects_as_the_api_shows_them(stack: Stack) -> None:
    with stack.client("admin") as admin:
        body(admin.post("/admin/organizations", json={"name": "initech"}), 201)
        tps = body(admin.post("/admin/projects", json={"name": "tps", "organization": "initech",
                                                        "models": ["nimble"]}), 201)
        shown = body(admin.get("/admin/organizations/initech"), 200)
        listed = next(o for o in body(admin.get("/admin/organizations"), 200)["data"] if o["name"] == "initech")
        missing = assert_error(admin.get("/admin/organizations/nosuch"), 404)
    assert shown == {**listed, "projects": [tps]}
    assert "nosuch" in missing["error"]


def test_a_rename_keeps_the_projects_and_is_audited(stack: Stack) -> None:
    with stack.client("admin") as admin:
        body(admin.post("/admin/organizations", json={"name": "initech"}), 201)
        body(admin.post("/admin/projects", json={"name": "tps", "organization": "initech"}), 201)
        before = body(admin.get("/admin/organizations/initech"), 200)
        renamed = body(admin.patch("/admin/organizations/initech", json={"name": "Initrode"}), 200)
        assert renamed == {**before, "name": "Initrode"}
        assert_error(admin.get("/admin/organizations/initech"), 404)
        assert body(admin.get("/admin/organizations/Initrode"), 200) == renamed
        # a project created in it afterwards names it by its new name
        body(admin.post("/admin/projects", json={"name": "memo", "organization": "Initrode"}), 201)
        assert [p["name"] for p in body(admin.get("/admin/organizations/Initrode"), 200)["projects"]] == ["memo", "tps"]
    [entry] = audit_entries(stack, "organization.rename")
    assert entry["target"] == "organization:Initrode" and entry["details"] == {"from": "initech", "to": "Initrode"}
    assert entry["actor"].startswith("admin-key:") and entry["request_id"]


def test_a_rename_to_its_own_name_changes_nothing(stack: Stack) -> None:
    with stack.client("admin") as admin:
        before = body(admin.get("/admin/organizations/default"), 200)
        assert body(admin.patch("/admin/organizations/default", json={"name": "default"}), 200) == before
    assert audit_entries(stack, "organization.rename") == []


def test_a_taken_name_is_a_conflict(stack: Stack) -> None:
    with stack.client("admin") as admin:
        body(admin.post("/admin/organizations", json={"name": "initech"}), 201)
        error = assert_error(admin.patch("/admin/organizations/default", json={"name": "initech"}),
                             409, "conflict_error")
        assert "initech" in error["error"]
        assert [o["name"] for o in body(admin.get("/admin/organizations"), 200)["data"]] == ["default", "initech"]


@pytest.mark.parametrize("payload", ['{"name": ""}', '{"name": "a\\u0000b"}', '{"name": "\\ud800"}',
                                     '{"name": "' + "x" * 201 + '"}', '{"name": 5}', '{"name": null}', "{}",
                                     '{"name": "ok", "owner": "me"}', '["ok"]', "{", ""])
def test_a_bad_new_name_is_a_400(stack: Stack, payload: str) -> None:
    with stack.client("admin") as admin:
        assert_error(admin.patch("/admin/organizations/default", content=payload,
                                 headers={"Content-Type": "application/json"}), 400)
        assert [o["name"] for o in body(admin.get("/admin/organizations"), 200)["data"]] == ["default"]
    assert audit_entries(stack, "organization.rename") == []


def test_a_blank_new_name_is_a_400_with_the_creation_rule(stack: Stack) -> None:
    with stack.client("admin") as admin:
        error = assert_error(admin.patch("/admin/organizations/default", json={"name": "   "}), 400)
    assert "non-empty" in error["error"]


def test_a_name_with_a_slash_is_reachable(stack: Stack) -> None:
    """Organization names may hold a '/' (unlike project names): the route takes it, raw or %2F."""
    with stack.client("admin") as admin:
        body(admin.post("/admin/organizations", json={"name": "emea/sales"}), 201)
        assert body(admin.get("/admin/organizations/emea/sales"), 200)["name"] == "emea/sales"
        renamed = body(admin.patch(f"/admin/organizations/{quote('emea/sales', safe='')}",
                                   json={"name": "emea/ops"}), 200)
        assert renamed["name"] == "emea/ops"


def test_a_viewer_reads_organizations_and_cannot_rename_them(stack: Stack) -> None:
    with stack.client("admin") as owner:
        viewer = body(owner.post("/admin/admin-keys", json={"role": "viewer"}), 201)["key"]
    with stack.gateway.client(viewer) as client:
        assert [o["name"] for o in body(client.get("/admin/organizations"), 200)["data"]] == ["default"]
        assert_error(client.patch("/admin/organizations/default", json={"name": "x"}), 403)
    with stack.gateway.client("arb_admin_wrong") as client:
        assert_error(client.get("/admin/organizations"), 401)
